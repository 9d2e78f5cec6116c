"""Online calibration of forecast intervals (docs/explain.md, "Forecasts").

A split-conformal correction, kept per quantity (start, finish): each
resolved forecast leaves a :class:`Residual`, in the log of the time from
the forecast to the event (plus one round, so that "now" is not log 0).
:func:`apply` widens (or narrows) each side of a new interval by the
conformal quantile of how far past that side recent actual values fell,
and moves the point by the median of the point's log-ratio errors, so a
forecast that has been too early is moved later. Nothing is fitted to a
trace: the state holds only the last :attr:`Calibration.limit` residuals
per band, and below :data:`MIN_RESIDUALS` the interval is left as the
draws made it. Two additions learn sooner: :func:`with_known_misses` counts
the forecasts still open whose high end has passed (known misses) for the
forecasts made now, and :func:`track` moves each side's miss level by
whether the intervals as shown missed (adaptive conformal inference).

The live leader keeps a :class:`Calibration` (it is a msgspec Struct, so it
serialises) and the simulator carries one through a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, TypeAlias, assert_never

import msgspec

Quantity: TypeAlias = Literal["start", "finish"]

# Residuals below which the draws' interval is used as it is.
MIN_RESIDUALS = 20
# The interval aimed at: 10th to 90th percentile, so each side may miss 10%.
MISS_PER_SIDE = 0.1
# The step of the adaptive miss level (Gibbs and Candes, "Adaptive
# conformal inference under distribution shift", 2021, whose gamma this
# is): each shown interval that resolves moves its side's level by
# STEP * (MISS_PER_SIDE - missed), so a side that misses more often than
# 10% is widened until, over the run, it misses 10%, whatever the drift.
STEP = 0.005


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
    """The recent residuals of start and finish forecasts, newest last,
    at most ``limit`` per band, and the miss level each side of each is
    corrected at (low side, high side; :func:`track`)."""

    start: tuple[Residual, ...] = ()
    finish: tuple[Residual, ...] = ()
    limit: int = 200  # residuals per band
    start_miss: tuple[float, float] = (MISS_PER_SIDE, MISS_PER_SIDE)
    finish_miss: tuple[float, float] = (MISS_PER_SIDE, MISS_PER_SIDE)


class Interval(msgspec.Struct, frozen=True):
    """A point forecast and its interval, epoch seconds, and the job's
    position in the queue when it was made (0: running)."""

    lo: float
    point: float
    hi: float
    position: int = 0


# Bands of a forecast: how far back in the queue the job is (running jobs,
# whose finish rests on a measured rate, apart; the jobs that arrive later
# and overtake a waiting one are what the model knows least) and how far
# ahead its point is, in rounds. A forecast is corrected by the residuals
# of its own band (Mondrian conformal prediction) once that band has
# MIN_RESIDUALS, else by those of its position band, else by all.
POSITIONS = (0, 3, 10, 30)
AHEAD_ROUNDS = (1.0, 4.0, 16.0)


def _back(forecast: Interval) -> int:
    return sum(1 for edge in POSITIONS if forecast.position > edge)


def band(at: float, forecast: Interval, scale: float) -> int:
    """The band of ``forecast`` made at ``at`` (``scale``: one round)."""
    ahead = max(0.0, forecast.point - at) / scale
    far = sum(1 for edge in AHEAD_ROUNDS if ahead > edge)
    return _back(forecast) * (len(AHEAD_ROUNDS) + 1) + far


def _span(at: float, t: float, scale: float) -> float:
    return max(0.0, t - at) + scale


def _at(at: float, w: float, scale: float) -> float:
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


def _with(cal: Calibration, quantity: Quantity,
          change: Callable[[tuple[Residual, ...]], tuple[Residual, ...]]) -> Calibration:
    """``cal`` with the residuals of ``quantity`` changed by ``change``."""
    match quantity:
        case "start":
            return msgspec.structs.replace(cal, start=change(cal.start))
        case "finish":
            return msgspec.structs.replace(cal, finish=change(cal.finish))
        case _:
            assert_never(quantity)


def observe(cal: Calibration, quantity: Quantity, at: float, forecast: Interval,
            actual: float, scale: float) -> Calibration:
    """``cal`` with the residual of one resolved forecast added (the oldest
    of its band dropped beyond ``limit`` in that band)."""
    r = residual(at, forecast, actual, scale)
    return _with(cal, quantity, lambda rs: _newest(rs, (r,), cal.limit))


def with_known_misses(cal: Calibration, quantity: Quantity,
                      pending: Iterable[tuple[float, Interval]], now: float,
                      scale: float) -> Calibration:
    """``cal`` with a provisional residual for every forecast of
    ``pending`` ((made at, its uncorrected interval), not yet resolved at
    ``now``) whose high end has passed: a known miss, whose actual value is
    at least ``now``, so its residual is taken with actual = ``now`` (a
    lower bound of how late it is; right-censored). Without these, a long
    wait reaches the calibration only when it ends, hours after the
    forecasts it should have widened. Use the result to correct the
    forecasts made at ``now`` and keep ``cal`` itself: the real residual
    replaces the provisional one when the forecast resolves
    (:func:`observe`). The provisional residuals count as the newest of
    their band (the oldest real ones drop beyond ``limit``)."""
    extra = [residual(at, f, now, scale) for at, f in pending if f.hi < now]
    if not extra:
        return cal
    return _with(cal, quantity, lambda rs: _newest(rs, extra, cal.limit))


def _newest(rs: tuple[Residual, ...], extra: Sequence[Residual],
            limit: int) -> tuple[Residual, ...]:
    """``rs`` then ``extra``, keeping the newest ``limit`` of each band:
    each band keeps its own recent past, so a busy band does not push a
    quiet one out."""
    kept: dict[int, int] = {}
    out: list[Residual] = []
    for r in reversed((*rs, *extra)):
        if kept.get(r.band, 0) < limit:
            kept[r.band] = kept.get(r.band, 0) + 1
            out.append(r)
    return tuple(reversed(out))


def track(cal: Calibration, quantity: Quantity, shown: Interval,
          actual: float) -> Calibration:
    """``cal`` with its miss levels moved by one resolved forecast as it was
    shown (corrected): each side's level falls by STEP * 0.9 if ``actual``
    fell past that side, else rises by STEP * 0.1 (adaptive conformal
    inference), kept within [0, 0.5]."""
    def moved(level: float, missed: bool) -> float:
        return min(0.5, max(0.0, level + STEP * (MISS_PER_SIDE - float(missed))))

    match quantity:
        case "start":
            lo, hi = cal.start_miss
        case "finish":
            lo, hi = cal.finish_miss
        case _:
            assert_never(quantity)
    levels = (moved(lo, actual < shown.lo), moved(hi, actual > shown.hi))
    match quantity:
        case "start":
            return msgspec.structs.replace(cal, start_miss=levels)
        case "finish":
            return msgspec.structs.replace(cal, finish_miss=levels)
        case _:
            assert_never(quantity)


def _conformal(scores: Sequence[float], miss: float) -> float:
    """The split-conformal quantile: the ceil((n+1)(1-miss))-th smallest score."""
    ordered = sorted(scores)
    k = min(len(ordered), math.ceil((len(ordered) + 1) * (1.0 - miss)))
    return ordered[max(k, 1) - 1]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


class Correction(msgspec.Struct, frozen=True):
    """How one band's forecasts are moved, in log time-from-forecast: the
    low side out by ``below``, the high side by ``above``, the point by
    ``mid``."""

    below: float
    above: float
    mid: float


def corrections(cal: Calibration, quantity: Quantity) -> dict[int, Correction]:
    """The correction of every band (:func:`band`) from ``cal``'s residuals:
    its own once it has :data:`MIN_RESIDUALS`, else its position band's,
    else all of them; none below that. Computed once per forecast."""
    match quantity:
        case "start":
            rs, (lo, hi) = cal.start, cal.start_miss
        case "finish":
            rs, (lo, hi) = cal.finish, cal.finish_miss
        case _:
            assert_never(quantity)
    rows = len(AHEAD_ROUNDS) + 1

    def of(chosen: Sequence[Residual]) -> Correction:
        return Correction(_conformal([r.below for r in chosen], lo),
                          _conformal([r.above for r in chosen], hi),
                          _median([r.mid for r in chosen]))

    out: dict[int, Correction] = {}
    whole = of(rs) if len(rs) >= MIN_RESIDUALS else None
    for back in range(len(POSITIONS) + 1):
        near = [r for r in rs if r.band // rows == back]
        wide = of(near) if len(near) >= MIN_RESIDUALS else whole
        for far in range(rows):
            mine = [r for r in near if r.band % rows == far]
            chosen = of(mine) if len(mine) >= MIN_RESIDUALS else wide
            if chosen is not None:
                out[back * rows + far] = chosen
    return out


def apply(cal: Calibration | Mapping[int, Correction], quantity: Quantity, at: float,
          forecast: Interval, scale: float) -> Interval:
    """``forecast`` (made at ``at``) corrected by the residuals of ``cal``
    (or by its :func:`corrections`, computed once for many forecasts): each
    side moved out (or in) by its conformal quantile, the point by the
    median error; the interval always holds the point."""
    table = corrections(cal, quantity) if isinstance(cal, Calibration) else cal
    c = table.get(band(at, forecast, scale))
    if c is None:
        return forecast
    lo_w = _span(at, forecast.lo, scale) * math.exp(-c.below)
    hi_w = _span(at, forecast.hi, scale) * math.exp(c.above)
    p_w = _span(at, forecast.point, scale) * math.exp(c.mid)
    lo, point, hi = (_at(at, w, scale) for w in (lo_w, p_w, hi_w))
    return Interval(min(lo, point), point, max(hi, point), forecast.position)
