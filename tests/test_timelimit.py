"""Per-job time limits: the spec's bounds, the pure rule that says which
running jobs are over their limit (:mod:`scheduling.live.timelimit`), the
running time a record closes at each phase change, and ``hops jobs``'s
``limit`` column."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from cli.client import render_jobs
from scheduling.live import state as st
from scheduling.live.timelimit import limits, running_s
from shared import events as ev
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import MAX_TIME_LIMIT_S, JobSpec
from shared.specs import SpecError, convert
from shared.wire import TIME_LIMIT


def spec(job_id: str = "j", time_limit: float | None = 60.0) -> JobSpec:
    return JobSpec(id=JobId(job_id), model="m", batch_size=32, params=10, total_samples=1000,
                   requirements=(1,), time_limit=time_limit)


def running(job_id: str, limit: float | None, run_s: float, since: float) -> st.LiveJobRecord:
    return st.LiveJobRecord(spec=spec(job_id, limit), submitted_at=0.0, phase="running",
                            since=since, run_s=run_s)


@pytest.mark.parametrize("bad", [0, -5, MAX_TIME_LIMIT_S + 1, float("nan"), float("inf")])
def test_a_bad_time_limit_is_refused_naming_the_field(bad: float) -> None:
    doc = msgspec.to_builtins(spec())
    doc["time_limit"] = bad
    with pytest.raises(SpecError, match="time_limit: must be > 0 and <= 31536000"):
        convert(doc, JobSpec, "jobs.yaml")


def test_a_limit_up_to_the_bound_is_kept_and_none_is_the_default() -> None:
    assert spec(time_limit=MAX_TIME_LIMIT_S).time_limit == MAX_TIME_LIMIT_S
    assert JobSpec(id=JobId("x"), model="m", batch_size=1, params=1, total_samples=1,
                   requirements=(1,)).time_limit is None


@given(limit=hs.floats(0.001, 1e6), run_s=hs.floats(0, 1e6), since=hs.floats(0, 1e6),
       after=hs.floats(0, 2e6))
def test_a_job_is_ended_exactly_when_it_has_run_for_its_limit(
    limit: float, run_s: float, since: float, after: float
) -> None:
    now = since + after
    rec = running("j", limit, run_s, since)
    found = limits([rec], now)
    ran = run_s + (now - since)  # the running time as the records' clock reads it
    assert running_s(rec, now) == ran
    assert found.over == ((JobId("j"),) if ran >= limit else ())
    if ran < limit:  # never before its limit, and the leader wakes for it
        assert found.next_in is not None and found.next_in == pytest.approx(limit - ran)
    else:
        assert found.next_in is None


@given(phase=hs.sampled_from(["submitted", "profiling", "queued", "finished", "cancelled"]),
       run_s=hs.floats(0, 1e6), after=hs.floats(0, 1e6))
def test_only_running_time_counts_and_only_running_jobs_are_ended(
    phase: Any, run_s: float, after: float
) -> None:
    rec = msgspec.structs.replace(running("j", 10.0, run_s, 0.0), phase=phase)
    assert running_s(rec, after) == run_s  # queued after a preemption: the clock stops
    assert limits([rec], after) == ((), None)


def test_jobs_without_a_limit_or_already_ended_are_left_out() -> None:
    recs = [running("a", None, 1e9, 0.0), running("b", 5.0, 10.0, 0.0),
            running("c", 5.0, 10.0, 0.0), running("d", 100.0, 10.0, 0.0)]
    assert limits(recs, 0.0, frozenset({JobId("c")})) == ((JobId("b"),), 90.0)


def test_the_record_sums_each_run_and_a_time_limit_cancel_says_timelimit() -> None:
    facts = st.Facts({ServerId("s0"): GpuType("V100")}, frozenset({GpuType("V100")}))
    config = Configuration.of({ServerId("s0"): 1})
    rec = running("j", 60.0, 0.0, 100.0)
    rec = msgspec.structs.replace(rec, configuration=config)
    stopped = st.apply_event(rec, ev.JobStopped(job_id=JobId("j"), at=130.0), 1, facts).record
    assert stopped is not None and stopped.phase == "queued" and stopped.run_s == 30.0
    # 50 s back in the queue do not count; the second run adds its 20 s
    again = st.apply_event(stopped, ev.JobStarted(job_id=JobId("j"), at=180.0,
                                                   configuration=config), 2, facts).record
    assert again is not None and running_s(again, 200.0) == 50.0
    ended = st.apply_event(again, ev.JobCancelled(job_id=JobId("j"), at=210.0,
                                                  reason=TIME_LIMIT), 3, facts).record
    assert ended is not None and (ended.phase, ended.reason, ended.run_s) == (
        "cancelled", "TimeLimit", 60.0)
    user = st.apply_event(again, ev.JobCancelled(job_id=JobId("j"), at=210.0), 3, facts).record
    assert user is not None and user.reason == "cancelled"


def test_hops_jobs_shows_the_limit_when_a_job_has_one() -> None:
    job = {"job_id": "a", "phase": "cancelled", "spec": {"model": "m", "total_samples": 10,
                                                          "time_limit": 90.0},
           "samples_done": 5.0, "submitted_at": 0.0, "waited_s": 1.0, "ran_s": 90.0,
           "restarts": 1, "reason": "TimeLimit"}
    lines = render_jobs({"jobs": [job]}).splitlines()
    assert lines[0].split()[8:11] == ["ran", "limit", "restarts"]
    assert lines[1].split()[-4:] == ["1m30s", "1m30s", "1", "TimeLimit"]
    plain = {**job, "spec": {"model": "m", "total_samples": 10}}
    assert "limit" not in render_jobs({"jobs": [plain]}).splitlines()[0].split()
