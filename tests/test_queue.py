"""Priorities, the service window and the sensitivity adjustment (Hops §3.6)."""

from __future__ import annotations

import pytest

from scheduling.fairness import raqlr
from scheduling.policies.hops.window import (
    QueueEntry,
    order_queue,
    sensitivity_adjustment,
    service_window,
)
from scheduling.priorities import (
    finish_time_fairness,
    job_facts,
    latency_ratio,
    priority_fn,
    weights,
)
from scheduling.profiling import plan_profiling
from shared.estimate import age
from shared.ids import JobId
from tests.helpers import cluster, flat_estimate, state


def entries(specs: list[tuple[int, float]]) -> list[QueueEntry]:
    return [QueueEntry(JobId(f"j{i}"), m, rho) for i, (m, rho) in enumerate(specs)]


def ids(es: list[QueueEntry]) -> list[str]:
    return [e.job_id for e in es]


def test_window_ends_with_the_job_that_reaches_capacity() -> None:
    # Minimums 2, 4, 1, 4, 2 against 8 GPUs: 2, 6, 7, 11 → the 4th job crosses.
    q = entries([(2, 1), (4, 1), (1, 1), (4, 1), (2, 1)])
    assert ids(service_window(q, 8)) == ["j0", "j1", "j2", "j3"]
    # Reaching capacity exactly closes the window there.
    q = entries([(4, 1), (4, 1), (1, 1)])
    assert ids(service_window(q, 8)) == ["j0", "j1"]
    assert service_window(q, 0) == []
    assert ids(service_window(q, 100)) == ["j0", "j1", "j2"]


def test_sensitivity_adjustment_worked_example() -> None:
    # rho_queue = (2 + 1.8 + 1.1 + 1.9 + 1.0 + 1.2) / 6 = 1.5; window {j0, j1} has 1.9.
    q = entries([(2, 2.0), (2, 1.8), (1, 1.1), (1, 1.9), (2, 1.0), (1, 1.2)])
    window = q[:2]
    # j2 (1.1) joins: set mean 1.633 > 1.5, go on; j3 (1.9) is not below 1.5;
    # j4 (1.0) joins: set mean (2 + 1.8 + 1.1 + 1.0) / 4 = 1.475 <= 1.5, stop.
    assert ids(sensitivity_adjustment(q, window, idle_gpus=4)) == ["j2", "j4"]
    # j4 needs 2 GPUs; with one idle GPU it is skipped and j5 (1.2) is tried.
    assert ids(sensitivity_adjustment(q, window, idle_gpus=1)) == ["j2", "j5"]


def test_no_adjustment_when_window_is_not_too_sensitive() -> None:
    q = entries([(1, 1.0), (1, 2.0), (1, 3.0)])
    assert sensitivity_adjustment(q, q[:1], idle_gpus=8) == []


def test_age_is_eq9() -> None:
    # P(A) = 24/32, P(B) = 8/32; R = {1,2,4,8}, R_avg = 3.75.
    # age = .75 * 1e6 / (100 * 3.75) + .25 * 1e6 / (200 * 3.75) = 2000 + 333.33
    c = cluster([("A", 3, 8), ("B", 1, 8)])
    est = flat_estimate("j", {"A": 100.0, "B": 200.0})
    assert age(est, c, 1e6, 3.75) == pytest.approx(2333.333, rel=1e-6)


def test_latency_ratio_and_ftf() -> None:
    c = cluster([("A", 3, 8), ("B", 1, 8)])
    est = flat_estimate("j", {"A": 100.0, "B": 200.0})
    job = state("j", [1, 2, 4, 8], wait_s=700.0, submit=0.0)
    facts = job_facts(job, est, c, now=1000.0, r_num=8, active_jobs=4)
    assert latency_ratio(job, facts) == pytest.approx(700 / 2333.333, rel=1e-6)
    # Equal share = min(8, 32 / 4) = 8 GPUs: T_id = age * 3.75 / 8.
    t_id = 2333.333 * 3.75 / 8
    assert finish_time_fairness(job, facts) == pytest.approx((1000 + 2333.333) / t_id, rel=1e-6)


def test_bias_rule_and_lambda() -> None:
    # A zero priority → bias 0.01, so every job keeps a positive weight.
    w = weights({"a": 0.0, "b": 0.5, "c": 1.0}, lam=1.0)
    assert w["a"] / w["c"] == pytest.approx(0.01 / 1.01)
    # Negative priorities (SJF, LAS): bias = |min| + 0.01.
    w = weights({"a": -3.0, "b": -1.0}, lam=1.0)
    assert w["a"] / w["b"] == pytest.approx(0.01 / 2.01)
    # All positive: no bias, and lambda magnifies differences.
    w = weights({"a": 1.0, "b": 2.0}, lam=2.0)
    assert w["a"] / w["b"] == pytest.approx(1 / 4)
    assert set(weights({"a": 1.0, "b": 7.0}, lam=0.0).values()) == {1.0}
    # A huge lambda must not overflow.
    assert weights({"a": 1.0, "b": 1e6}, lam=500.0)["b"] == 1.0


def test_queue_order_is_total() -> None:
    prios = {JobId("b"): 1.0, JobId("a"): 1.0, JobId("c"): 2.0}
    submit = {JobId("a"): 5.0, JobId("b"): 5.0, JobId("c"): 9.0}
    assert order_queue(prios, submit) == ["c", "a", "b"]


def test_unknown_priority_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown priority 'edf'"):
        priority_fn("edf")


def test_profiling_takes_one_gpu_per_type_best_fit() -> None:
    c = cluster([("A", 2, 8), ("B", 1, 4)])
    free = {"A-0": 8, "A-1": 3, "B-0": 0}
    jobs = [
        state("late", [1], submit=5, phase="profiling", unprofiled=["A"]),
        state("early", [1], submit=1, phase="profiling", unprofiled=["A", "B"]),
    ]
    tasks, left = plan_profiling(jobs, c, free)  # type: ignore[arg-type]
    # 'early' goes first and takes the fuller server A-1; B has no free GPU.
    assert [(t.job_id, t.server) for t in tasks] == [("early", "A-1"), ("late", "A-1")]
    assert left == {"A-0": 8, "A-1": 1, "B-0": 0}


def test_raqlr_averages_recent_deaths() -> None:
    finished = [(0.0, 5.0), (7200.0, 1.0), (9000.0, 0.5)]
    assert raqlr(finished, now=9000.0, window_h=1.0) == pytest.approx(0.75)
    assert raqlr(finished, now=9000.0, window_h=0.1) == pytest.approx(0.5)
    assert raqlr([], now=1.0, window_h=1.0) == 0.0
