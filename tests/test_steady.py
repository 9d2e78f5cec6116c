"""Guards around a Hops plan: an unplaceable job holds nothing back, and a
running job is not moved for nothing."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.policies.hops.policy import HopsPolicy
from scheduling.policies.hops.steady import keep_in_place
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.snapshot import Assignment, JobState, Plan, Snapshot
from tests.helpers import cluster, flat_estimate, state
from tests.test_planner import snapshots


def others_gpus(plan: Plan, but: str) -> int:
    return sum(a.config.total_gpus for a in plan.assignments if a.job_id != but)


def with_job(snap: Snapshot, job: JobState, rho: float = 1.0) -> Snapshot:
    types = {t.name: 100.0 for t in snap.cluster.gpu_types}
    est = flat_estimate(job.id, types, rho=rho)
    return msgspec.structs.replace(
        snap, jobs=(job, *snap.jobs), estimates={**snap.estimates, job.id: est}
    )


def test_a_job_larger_than_the_cluster_does_not_stall_the_others() -> None:
    # The 1,000-GPU job has waited longest and heads the queue: without the
    # guard it alone filled the service window and the ILP assigned nothing.
    c = cluster([("A", 2, 8)])
    small = [state(f"s{i}", [4], wait_s=10.0) for i in range(4)]
    snap = Snapshot(now=1000.0, cluster=c, jobs=tuple(small), estimates={
        j.id: flat_estimate(j.id, {"A": 100.0}) for j in small
    })
    huge = state("huge", [1000], wait_s=900.0)
    plan = HopsPolicy().plan(with_job(snap, huge))
    assert others_gpus(plan, "huge") == 16
    assert plan.config_of(JobId("huge")) is None
    assert plan.reasons.unplaceable == ("huge",)


def test_a_job_too_large_for_this_rounds_free_gpus_is_left_out_this_round() -> None:
    # 12 GPUs of type A, but A-0 is held (down or reserved) this round: the
    # 8-GPU job fits the cluster, not what is free now.
    c = cluster([("A", 2, 6)])
    snap = Snapshot(now=1000.0, cluster=c, jobs=(state("s", [2], wait_s=1.0),),
                    estimates={JobId("s"): flat_estimate("s", {"A": 100.0})},
                    held={ServerId("A-0"): 6})
    plan = HopsPolicy().plan(with_job(snap, state("wide", [8], wait_s=500.0)))
    assert plan.reasons.unplaceable == ("wide",)
    assert plan.config_of(JobId("s")) is not None
    free = msgspec.structs.replace(snap, held={})
    assert HopsPolicy().plan(with_job(free, state("wide", [8], wait_s=500.0))).config_of(
        JobId("wide")
    ) is not None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.integers(1, 4096), st.floats(0, 1e6))
def test_an_unplaceable_job_never_lowers_the_gpus_of_the_others(
    snap: Snapshot, beyond: int, wait: float
) -> None:
    # Its smallest requirement exceeds every GPU of the cluster.
    reqs = [snap.cluster.total_gpus + beyond]
    before = HopsPolicy().plan(snap)
    after = HopsPolicy().plan(with_job(snap, state("x-unplaceable", reqs, wait_s=wait)))
    assert after.config_of(JobId("x-unplaceable")) is None
    assert others_gpus(after, "x-unplaceable") >= others_gpus(before, "x-unplaceable")


def running(job_id: str, config: dict[str, int]) -> JobState:
    spec = state(job_id, [sum(config.values())]).spec
    return JobState(spec=spec, phase="running", current=Configuration.of(config))


def test_a_job_moved_to_a_twin_server_goes_back() -> None:
    c = cluster([("A", 2, 4)])
    job = running("r", {"A-1": 4})
    ests = {job.id: flat_estimate("r", {"A": 100.0})}
    moved = [Assignment(job.id, Configuration.of({"A-0": 4}))]
    free = {s.id: 4 for s in c.servers}
    kept = keep_in_place(moved, {job.id: job}, ests, c, free)
    assert kept[0].config == Configuration.of({"A-1": 4})
    # Its old GPUs taken by another job: the move stands.
    other = Assignment(JobId("o"), Configuration.of({"A-1": 2}))
    kept = keep_in_place([*moved, other], {job.id: job}, ests, c, free)
    assert kept[0].config == Configuration.of({"A-0": 4})


def test_a_move_to_a_faster_type_stands() -> None:
    c = cluster([("A", 1, 4), ("B", 1, 4)])
    job = running("r", {"A-0": 4})
    ests = {job.id: flat_estimate("r", {"A": 100.0, "B": 150.0})}
    moved = [Assignment(job.id, Configuration.of({"B-0": 4}))]
    free = {s.id: 4 for s in c.servers}
    assert keep_in_place(moved, {job.id: job}, ests, c, free) == moved


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 4), st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=6))
def test_running_jobs_on_twin_servers_stay_where_they_are(servers: int, sizes: list[int]) -> None:
    # Jobs already running on identical servers, nothing waiting: a first
    # plan has no reason to move any of them.
    c = cluster([("A", servers, 4)])
    free = {s.id: 4 for s in c.servers}
    jobs: list[JobState] = []
    for i, g in enumerate(sizes):
        host = next((s for s in reversed(c.servers) if free[s.id] >= g), None)
        if host is None:
            break
        free[host.id] -= g
        jobs.append(running(f"r{i}", {host.id: g}))
    ests = {j.id: flat_estimate(j.id, {"A": 100.0}) for j in jobs}
    plan = HopsPolicy().plan(Snapshot(now=100.0, cluster=c, jobs=tuple(jobs), estimates=ests))
    for j in jobs:
        assert plan.config_of(j.id) == j.current
