"""The calibration's bookkeeping (scheduling/forecast/tracking.py) and the
live leader's use of it (scheduling/live/forecasting.py): a forecast is
opened on the intervals the draws made, resolved by its job's start or
finish into the calibration, once, and the state round-trips through its
encoding."""

from __future__ import annotations

import msgspec

from scheduling.forecast import Calibration, calibrated
from scheduling.forecast.calibration import MIN_RESIDUALS, Interval, residual
from scheduling.forecast.tracking import Tracker, decode, encode, kept, opened, resolved
from scheduling.live import forecasting
from scheduling.live.state import LiveJobRecord
from shared import events as ev
from shared.configuration import Configuration
from shared.explain import JobForecast, QueueForecast
from shared.ids import JobId, TenantId
from shared.job import JobSpec

ROUND = 60.0
W, R = JobId("t/w"), JobId("t/r")


def entry(job: JobId, position: int, start: float, finish: float) -> JobForecast:
    return JobForecast(job_id=job, position=position, tenant_position=position, start=start,
                       start_lo=start - 30.0, start_hi=start + 30.0, finish=finish,
                       finish_lo=finish - 60.0, finish_hi=finish + 60.0)


def queue(at: float) -> QueueForecast:
    """``R`` running since ``at``, ``W`` waiting: forecast to start 2 rounds on."""
    return QueueForecast(at=at, jobs=(entry(R, 0, at, at + 600.0),
                                      entry(W, 1, at + 120.0, at + 900.0)), draws=8)


def test_a_start_resolves_the_waiting_jobs_forecast_into_the_calibration_once() -> None:
    t = Tracker()
    assert opened(t, queue(0.0), started={R}) == [1]  # only W's makes a record
    assert list(t.open_start) == [W] and set(t.open_finish) == {W, R}
    # W started three rounds on, a round later than forecast
    done = resolved(t, W, 180.0, finished=False, scale=ROUND)
    assert [o.record for o in done] == [0]
    assert t.calibration.start == (
        residual(0.0, Interval(90.0, 120.0, 150.0, 1), 180.0, ROUND),)
    assert t.calibration.start[0].above > 0  # it started after the interval's top
    assert t.calibration.finish == ()
    assert resolved(t, W, 200.0, finished=False, scale=ROUND) == []  # a repeat: nothing
    assert len(t.calibration.start) == 1
    resolved(t, R, 660.0, finished=True, scale=ROUND)
    assert len(t.calibration.finish) == 1 and R not in t.open_finish


def test_resolved_forecasts_move_the_next_forecasts() -> None:
    t = Tracker()
    for k in range(MIN_RESIDUALS):
        at = k * 1000.0
        opened(t, queue(at), started=set())
        resolved(t, W, at + 300.0, finished=False, scale=ROUND)  # always late
    q = queue(10**6)
    shown = calibrated(q, t.calibration, ROUND)
    assert shown.jobs[1].start > q.jobs[1].start  # moved later
    assert shown.jobs[1].start_hi >= q.jobs[1].start_hi
    assert calibrated(q, Calibration(), ROUND) == q


def test_the_state_round_trips_through_its_encoding_and_stays_bounded() -> None:
    t = Tracker(per_job=3)
    for k in range(5):
        opened(t, queue(k * 60.0), started={R})
    assert [o.at for o in t.open_start[W]] == [120.0, 180.0, 240.0]  # the newest 3
    assert len(t.open_finish[R]) == 1  # opened once, when its plan started it
    resolved(t, W, 400.0, finished=False, scale=ROUND)
    back = decode(encode(t))
    assert back == t
    assert msgspec.json.decode(encode(t))["calibration"]["start"]  # JSON, as stored
    assert kept(back, [W]) and R not in back.open_finish and W in back.open_finish
    assert not kept(back, [W])


def live(phase: str) -> LiveJobRecord:
    spec = JobSpec(id=W, model="m", batch_size=32, params=10_000_000, total_samples=1000,
                   requirements=(1,), tenant=TenantId("t"))
    rec = LiveJobRecord(spec=spec, submitted_at=0.0, since=42.0)
    return msgspec.structs.replace(rec, phase=phase)  # type: ignore[arg-type]


def test_the_leader_resolves_at_the_events_own_time_and_not_on_a_profiling_run() -> None:
    t = Tracker()
    opened(t, queue(0.0), started=set())
    start = ev.JobStarted(job_id=W, configuration=Configuration.of({"n0": 1}), at=180.0)
    assert not forecasting.resolve_event(t, live("profiling"), start, ROUND)
    assert forecasting.resolve_event(t, live("running"), start, ROUND)
    assert not forecasting.resolve_event(t, live("running"), start, ROUND)  # delivered again
    assert t.calibration.start[0] == residual(0.0, Interval(90.0, 120.0, 150.0, 1), 180.0,
                                              ROUND)
    assert forecasting.resolve_event(t, live("finished"), ev.JobFinished(job_id=W, at=990.0),
                                     ROUND)
    assert forecasting.started({W: live("running"), R: live("queued")}) == {W: 42.0}
