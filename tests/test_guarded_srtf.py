"""The guarded SRTF priority (scheduling/priorities.py): remaining time
orders the queue, except that a job whose latency ratio reached the guard
goes first, by its latency ratio; and in a saturated stream it bounds the
starvation SRTF allows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduling.priorities import (
    LR_GUARD,
    JobFacts,
    guarded_srtf,
    shortest_remaining_first,
)
from shared.ids import JobId
from shared.job import JobSpec
from shared.snapshot import JobState
from tests.test_simulator import run, small_cluster, starving_workload


def job(wait_s: float) -> JobState:
    return JobState(spec=JobSpec(JobId("j"), "m", 32, 1000, 10**6, requirements=(1,)),
                    wait_s=wait_s)


def facts(age_s: float, remaining_s: float) -> JobFacts:
    return JobFacts(age_s=age_s, remaining_s=remaining_s, isolated_s=age_s, elapsed_s=0.0)


@given(st.floats(1.0, 1e6), st.floats(0.0, 1e6), st.floats(0.0, 1e6), st.floats(0.0, 1e6))
def test_below_the_guard_it_is_srtf_and_a_guarded_job_goes_first(
        age: float, remaining: float, other: float, wait: float) -> None:
    f = facts(age, min(remaining, age))
    p = guarded_srtf(job(wait), f)
    if wait / age < LR_GUARD:
        assert p == shortest_remaining_first(job(wait), f)
    else:
        assert p == wait / age >= LR_GUARD
        assert p > guarded_srtf(job(0.0), facts(age, min(other, age)))


def test_the_guard_bounds_the_starvation_that_srtf_allows() -> None:
    cluster = small_cluster()
    worst = {}
    for priority in ("srtf", "guarded-srtf"):
        result, _ = run(cluster, starving_workload(), "hops-profile-preempt:preempt_exempt=0",
                        priority)
        worst[priority] = max(j.lr for j in result.jobs)
    assert worst["guarded-srtf"] < worst["srtf"] / 2
