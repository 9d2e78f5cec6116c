"""The simulator's forecasts (opt-in, ``SimSettings.forecast``): the whole
queue forecast at each round's first plan (:func:`scheduling.forecast.forecast`),
calibrated online by the forecasts already resolved, and each waiting
job's forecast recorded with what then happened (:class:`ForecastRecord`),
for bench/forecast_calibration.py. A mixin of
:class:`~simulator.engine.Simulation`; off, it does nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from typing import TYPE_CHECKING

import msgspec

from scheduling.forecast import (
    Calibration,
    Interval,
    calibrated,
    forecast,
    observe,
    track,
    with_known_misses,
)
from scheduling.forecast.calibration import Quantity
from shared.explain import JobForecast
from shared.ids import JobId
from shared.snapshot import Plan, Snapshot

if TYPE_CHECKING:
    from simulator.settings import SimSettings
    from simulator.state import JobRecord


class ForecastRecord(msgspec.Struct, frozen=True):
    """One waiting job's forecast made at ``at`` (calibrated, as shown) and
    what happened: its next start after ``at`` and its finish (None: never,
    within the run). ``gpus``: the largest of its requirements."""

    at: float
    gpus: int
    forecast: JobForecast
    actual_start: float | None = None
    actual_finish: float | None = None


@dataclass
class _Open:
    """A recorded forecast not yet resolved, with the uncalibrated intervals
    its residuals are taken on and, for a record, the intervals shown,
    whose misses move the calibration's miss levels."""

    index: int
    at: float
    start: Interval
    finish: Interval
    shown: tuple[Interval, Interval] | None = None
    # The quantities whose shown interval is already counted as a miss
    # (:func:`_track_known_misses`), not to be counted again on resolving.
    known: set[Quantity] = field(default_factory=set)


@dataclass
class ForecastLog:
    """The calibration carried through a run and the records so far."""

    calibration: Calibration = field(default_factory=Calibration)
    records: list[ForecastRecord] = field(default_factory=list)
    open_start: dict[JobId, list[_Open]] = field(default_factory=dict)
    open_finish: dict[JobId, list[_Open]] = field(default_factory=dict)


def _with_open(log: ForecastLog, now: float, round_s: float) -> Calibration:
    """The calibration with the open forecasts that are already known
    misses (their high end passed, the job not started, or not finished)."""
    starts = ((o.at, o.start) for opens in log.open_start.values() for o in opens)
    finishes = ((o.at, o.finish) for opens in log.open_finish.values() for o in opens)
    cal = with_known_misses(log.calibration, "start", starts, now, round_s)
    return with_known_misses(cal, "finish", finishes, now, round_s)


def _track_known_misses(log: ForecastLog, now: float) -> None:
    """Count each shown interval whose high end has passed, its job not
    started (or not finished), as the miss it already is: the miss levels
    learn of a long wait while it goes on, as the residuals do
    (:func:`_with_open`)."""
    cal = log.calibration
    opens: tuple[tuple[Quantity, dict[JobId, list[_Open]]], ...] = (
        ("start", log.open_start), ("finish", log.open_finish))
    for quantity, by_job in opens:
        side = 0 if quantity == "start" else 1
        for o in (o for os in by_job.values() for o in os):
            if o.shown is None or quantity in o.known or o.shown[side].hi >= now:
                continue
            cal = track(cal, quantity, o.shown[side], now)
            o.known.add(quantity)
    log.calibration = cal


class Forecasting:
    """Forecasts at first plans, on the engine's state."""

    settings: SimSettings
    now: float
    _forecasts: ForecastLog | None = None

    def _forecast(self, snap: Snapshot, plan: Plan, round_index: int) -> None:
        """Forecast the queue after the round's first plan and record each
        waiting job's forecast."""
        if not self.settings.forecast:
            return
        log = self._forecasts = self._forecasts or ForecastLog()
        s = self.settings
        raw = forecast(snap, plan, round_s=s.round_s, seed=s.seed * 1_000_003 + round_index,
                       draws=s.forecast_draws, whatif=False, fill_s=s.fill_delay_s,
                       r_num=s.r_num, preempt=s.forecast_preempt,
                       arrivals=s.forecast_arrivals)
        _track_known_misses(log, raw.at)
        shown = calibrated(raw, _with_open(log, raw.at, s.round_s), s.round_s)
        sizes = {j.id: max(j.spec.requirement_set(s.r_num), default=0) for j in snap.jobs}
        started = {a.job_id for a in plan.assignments}
        for f, g in zip(raw.jobs, shown.jobs, strict=True):
            entry = _Open(len(log.records), raw.at,
                          Interval(f.start_lo, f.start, f.start_hi, f.position),
                          Interval(f.finish_lo, f.finish, f.finish_hi, f.position))
            if not f.position:
                # A job this plan starts: its finish forecast is one of run
                # time alone, which resolves sooner; it calibrates finishes
                # but is not a waiting job's record.
                if f.job_id in started and f.job_id not in log.open_finish:
                    log.open_finish[f.job_id] = [dataclass_replace(entry, index=-1)]
                continue
            entry.shown = (Interval(g.start_lo, g.start, g.start_hi, g.position),
                           Interval(g.finish_lo, g.finish, g.finish_hi, g.position))
            log.records.append(ForecastRecord(at=raw.at, gpus=sizes[g.job_id], forecast=g))
            log.open_start.setdefault(g.job_id, []).append(entry)
            log.open_finish.setdefault(g.job_id, []).append(entry)

    def _forecast_resolved(self, rec: JobRecord, finished: bool) -> None:
        """``rec`` started (or finished) now: resolve its open forecasts."""
        log = self._forecasts
        if log is None:
            return
        opened = (log.open_finish if finished else log.open_start).pop(rec.id, [])
        cal = log.calibration
        quantity: Quantity = "finish" if finished else "start"
        for o in opened:
            raw = o.finish if finished else o.start
            cal = observe(cal, quantity, o.at, raw, self.now, self.settings.round_s)
            if o.shown is not None and quantity not in o.known:
                cal = track(cal, quantity, o.shown[1] if finished else o.shown[0], self.now)
            if o.index < 0:
                continue  # not a record (a job its plan started)
            r = log.records[o.index]
            log.records[o.index] = msgspec.structs.replace(
                r, **{"actual_finish" if finished else "actual_start": self.now})
        log.calibration = cal

    def _forecast_records(self) -> tuple[ForecastRecord, ...]:
        return tuple(self._forecasts.records) if self._forecasts is not None else ()
