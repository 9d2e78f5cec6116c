"""Forecasts: each job's position and estimated start and finish with an
interval, by running the plan and then the policy's order forward from a
snapshot (shared.explain.QueueForecast). Pure and deterministic for a given
seed; docs/explain.md, "Forecasts", says how and where it departs from
running the policy itself.

- :func:`forecast`: the whole queue after one plan.
- :class:`Calibration`, :func:`observe`, :func:`calibrated`: the online
  correction of the intervals by resolved forecasts;
  :func:`with_known_misses`: with the forecasts still open whose high end
  has passed (known misses), to correct the forecasts of this round;
  :func:`track`: the miss levels moved by a resolved forecast as shown.
- :func:`estimator_sigma`, :func:`estimator_bias`: the estimator's error
  and bias as running jobs measure them.
"""

from __future__ import annotations

from scheduling.forecast.build import DEFAULT_SIGMA, estimator_bias, estimator_sigma
from scheduling.forecast.calibration import (
    Calibration,
    Correction,
    Interval,
    Residual,
    apply,
    corrections,
    observe,
    track,
    with_known_misses,
)
from scheduling.forecast.queue import calibrated, forecast

__all__ = [
    "DEFAULT_SIGMA",
    "Calibration",
    "Correction",
    "Interval",
    "Residual",
    "apply",
    "calibrated",
    "corrections",
    "estimator_bias",
    "estimator_sigma",
    "forecast",
    "observe",
    "track",
    "with_known_misses",
]
