"""Online calibration of forecast intervals (docs/explain.md, "Forecasts").

A split-conformal correction, kept per quantity (start, finish): each
resolved forecast leaves a :class:`Residual`, in the log of the time from
the forecast to the event (plus one round, so that "now" is not log 0).
:func:`apply` widens (or narrows) each side of a new interval by the
conformal quantile of how far past that side recent actual values fell,
and moves the point by the median of the point's log-ratio errors, so a
forecast that has been too early is moved later. Nothing is fitted to a
trace: the state holds only the last :attr:`Calibration.limit` residuals,
and below :data:`MIN_RESIDUALS` the interval is left as the draws made it.

The live leader keeps a :class:`Calibration` (it is a msgspec Struct, so it
serialises) and the simulator carries one through a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypeAlias, assert_never

import msgspec

Quantity: TypeAlias = Literal["start", "finish"]

# Residuals below which the draws' interval is used as it is.
MIN_RESIDUALS = 20
# The interval aimed at: 10th to 90th percentile, so each side may miss 10%.
MISS_PER_SIDE = 0.1


class Residual(msgspec.Struct, frozen=True, array_like=True):
    """One resolved forecast, in log time-from-forecast: ``mid`` = log(actual
    / point); ``below`` = log(lo / actual) and ``above`` = log(actual / hi),
    each positive when the actual value fell outside that side. ``band``:
    how far ahead the point was (:func:`band`)."""

    mid: float
    below: float
    above: float
    band: int = 0


class Calibration(msgspec.Struct, frozen=True, kw_only=True):
    """The recent residuals of start and finish forecasts, newest last."""

    start: tuple[Residual, ...] = ()
    finish: tuple[Residual, ...] = ()
    limit: int = 500


class Interval(msgspec.Struct, frozen=True):
    """A point forecast and its interval, epoch seconds, and the job's
    position in the queue when it was made (0: running)."""

    lo: float
    point: float
    hi: float
    position: int = 0


# Bands of a forecast: how far ahead its point is, in rounds, and how far
# back in the queue the job is (the jobs that arrive later and overtake it
# are what the model does not know). A forecast is corrected by the
# residuals of its own band (Mondrian conformal prediction) once that band
# has enough, else by all.
AHEAD_ROUNDS = (1.0, 4.0, 16.0)
POSITIONS = (3, 10, 30)


def band(at: float, forecast: Interval, scale: float) -> int:
    """The band of ``forecast`` made at ``at`` (``scale``: one round)."""
    ahead = max(0.0, forecast.point - at) / scale
    far = sum(1 for edge in AHEAD_ROUNDS if ahead > edge)
    back = sum(1 for edge in POSITIONS if forecast.position > edge)
    return far * (len(POSITIONS) + 1) + back


def _span(at: float, t: float, scale: float) -> float:
    return max(0.0, t - at) + scale


def _back(at: float, w: float, scale: float) -> float:
    return at + max(0.0, w - scale)


def residual(at: float, forecast: Interval, actual: float, scale: float) -> Residual:
    """The residual of ``forecast`` made at ``at`` once ``actual`` is known;
    ``scale`` (one round) keeps the logs finite."""
    y = _span(at, actual, scale)
    return Residual(
        mid=math.log(y / _span(at, forecast.point, scale)),
        below=math.log(_span(at, forecast.lo, scale) / y),
        above=math.log(y / _span(at, forecast.hi, scale)),
        band=band(at, forecast, scale),
    )


def observe(cal: Calibration, quantity: Quantity, at: float, forecast: Interval,
            actual: float, scale: float) -> Calibration:
    """``cal`` with the residual of one resolved forecast added (the oldest
    dropped beyond ``limit``)."""
    r = residual(at, forecast, actual, scale)
    match quantity:
        case "start":
            return msgspec.structs.replace(cal, start=(*cal.start, r)[-cal.limit:])
        case "finish":
            return msgspec.structs.replace(cal, finish=(*cal.finish, r)[-cal.limit:])
        case _:
            assert_never(quantity)


def _conformal(scores: Sequence[float], miss: float) -> float:
    """The split-conformal quantile: the ceil((n+1)(1-miss))-th smallest score."""
    ordered = sorted(scores)
    k = min(len(ordered), math.ceil((len(ordered) + 1) * (1.0 - miss)))
    return ordered[k - 1]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def apply(cal: Calibration, quantity: Quantity, at: float, forecast: Interval,
          scale: float) -> Interval:
    """``forecast`` (made at ``at``) corrected by the residuals of ``cal``:
    each side moved out (or in) by its conformal quantile, the point by the
    median error; the interval always holds the point."""
    match quantity:
        case "start":
            rs = cal.start
        case "finish":
            rs = cal.finish
        case _:
            assert_never(quantity)
    own = band(at, forecast, scale)
    mine = [r for r in rs if r.band == own]
    if len(mine) >= MIN_RESIDUALS:
        rs = tuple(mine)
    elif len(rs) < MIN_RESIDUALS:
        return forecast
    lo_w = _span(at, forecast.lo, scale) * math.exp(-_conformal([r.below for r in rs],
                                                                 MISS_PER_SIDE))
    hi_w = _span(at, forecast.hi, scale) * math.exp(_conformal([r.above for r in rs],
                                                                MISS_PER_SIDE))
    p_w = _span(at, forecast.point, scale) * math.exp(_median([r.mid for r in rs]))
    lo, point, hi = (_back(at, w, scale) for w in (lo_w, p_w, hi_w))
    return Interval(min(lo, point), point, max(hi, point), forecast.position)
