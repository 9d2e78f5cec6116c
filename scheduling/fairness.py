"""Latency-ratio bookkeeping that outlives a job (Hops §3.6, Eq. 7)."""

from __future__ import annotations

from collections.abc import Iterable


def raqlr(finished: Iterable[tuple[float, float]], now: float, window_h: float) -> float:
    """Recent Average Queue Latency Ratio, Eq. (7).

    ``finished`` holds ``(end_time_s, latency_ratio)`` of jobs that have died;
    the result averages those that died within the last ``window_h`` hours
    (0 when none did).
    """
    horizon = now - window_h * 3600.0
    recent = [lr for t, lr in finished if horizon <= t <= now]
    return sum(recent) / len(recent) if recent else 0.0
