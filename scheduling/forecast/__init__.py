"""Forecasts: each job's position and estimated start and finish with an
interval, by running the policy's decisions forward from a snapshot
(shared.explain.QueueForecast). Pure and deterministic for a given seed.

PLACEHOLDER: the signature is the contract; the implementation lands with
the forecast work.
"""

from __future__ import annotations

from shared.explain import QueueForecast
from shared.snapshot import Plan, Snapshot


def forecast(snapshot: Snapshot, plan: Plan, *, round_s: float, seed: int = 0,
             draws: int = 8, whatif: bool = True) -> QueueForecast:
    """The forecast of every job of ``snapshot`` after ``plan`` (made from it)."""
    return QueueForecast(at=snapshot.now)
