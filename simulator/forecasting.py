"""The simulator's forecasts (opt-in, ``SimSettings.forecast``): the whole
queue forecast at each round's first plan (:func:`scheduling.forecast.forecast`),
calibrated online by the forecasts already resolved, and each waiting
job's forecast recorded with what then happened (:class:`ForecastRecord`),
for bench/forecast_calibration.py. A mixin of
:class:`~simulator.engine.Simulation`; off, it does nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from scheduling.forecast import calibrated, forecast
from scheduling.forecast.tracking import Tracker, current, known_misses, opened, resolved
from shared.explain import JobForecast
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
class ForecastLog:
    """The calibration's bookkeeping carried through a run and the records so far."""

    tracker: Tracker = field(default_factory=Tracker)
    records: list[ForecastRecord] = field(default_factory=list)


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
        known_misses(log.tracker, raw.at)
        shown = calibrated(raw, current(log.tracker, raw.at, s.round_s), s.round_s)
        sizes = {j.id: max(j.spec.requirement_set(s.r_num), default=0) for j in snap.jobs}
        started = {a.job_id for a in plan.assignments}
        for i in opened(log.tracker, raw, started, len(log.records), shown):
            g = shown.jobs[i]
            log.records.append(ForecastRecord(at=raw.at, gpus=sizes[g.job_id], forecast=g))

    def _forecast_resolved(self, rec: JobRecord, finished: bool) -> None:
        """``rec`` started (or finished) now: resolve its open forecasts."""
        log = self._forecasts
        if log is None:
            return
        done = resolved(log.tracker, rec.id, self.now, finished=finished,
                        scale=self.settings.round_s)
        for o in done:
            if o.record < 0:
                continue  # not a record (a job its plan started)
            r = log.records[o.record]
            log.records[o.record] = msgspec.structs.replace(
                r, **{"actual_finish" if finished else "actual_start": self.now})

    def _forecast_records(self) -> tuple[ForecastRecord, ...]:
        return tuple(self._forecasts.records) if self._forecasts is not None else ()
