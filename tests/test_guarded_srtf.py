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
    guarded_delay,
    guarded_srtf,
    shortest_remaining_first,
    weights,
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


@given(st.floats(1.0, 1e6), st.floats(0.0, 1e6), st.floats(0.0, 1e6), st.floats(0.0, 1e6))
def test_guarded_delay_orders_as_guarded_srtf_on_one_scale(
        age: float, remaining: float, other: float, wait: float) -> None:
    f = facts(age, min(remaining, age))
    p = guarded_delay(job(wait), f)
    if wait / age < LR_GUARD:  # below the guard: in (0, 1], shorter first, as SRTF
        assert 0.0 < p <= 1.0
        shorter = facts(age, min(remaining, age) / 2)
        assert guarded_delay(job(wait), shorter) >= p
    else:
        assert p == guarded_srtf(job(wait), f) >= LR_GUARD
        assert p >= guarded_delay(job(0.0), facts(age, min(other, age)))


def test_a_guarded_job_outweighs_short_ones_in_the_ilp_only_on_one_scale() -> None:
    # Eq. (11)'s weights from the priorities: a job past its guard (latency
    # ratio 3) against a 5-minute and a 10-hour job below it. With SRTF's
    # -remaining the bias makes the guarded job weigh about as much as the
    # short one, so twelve short 1-GPU jobs outweigh one wide guarded job.
    guarded = job(3000.0), facts(1000.0, 1000.0)
    short, long = (job(0.0), facts(1e5, 300.0)), (job(0.0), facts(1e5, 36000.0))
    for fn, at_least in ((guarded_srtf, 1.0), (guarded_delay, 6.0)):
        w = weights({"g": fn(*guarded), "s": fn(*short), "l": fn(*long)}, 1.0)
        assert w["g"] >= w["s"] >= w["l"]
        assert (w["g"] / w["s"] >= at_least) and (fn is guarded_delay or w["g"] / w["s"] < 1.01)
