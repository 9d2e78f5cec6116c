"""The profiling queue's limits (§3.2): idle GPUs only, a share of each type."""

from __future__ import annotations

import msgspec

from scheduling.live.snapshot import profiling_step
from scheduling.live.state import new_record
from scheduling.profiling import (
    busy_types,
    profile_first,
    profiling_budget,
    queue_without,
    reprofile,
)
from scheduling.registry import make_policy
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import JobState, Snapshot
from tests.helpers import cluster, flat_estimate, state


def running(job_id: str, config: dict[str, int]) -> JobState:
    spec = state(job_id, [sum(config.values())]).spec
    return JobState(spec=spec, phase="running", current=Configuration.of(config))


def newcomers(n: int, types: list[str]) -> list[JobState]:
    return [state(f"new{i}", [1], submit=i, phase="profiling", unprofiled=types) for i in range(n)]


def test_profiling_never_takes_a_running_jobs_gpu() -> None:
    # A-0 is wholly taken by a running job; a first plan replans it, so its
    # GPUs count as free, but the newcomer waits for an idle GPU.
    c = cluster([("A", 1, 4)])
    jobs = (running("r", {"A-0": 4}), *newcomers(1, ["A"]))
    ests = {JobId("r"): flat_estimate("r", {"A": 1.0})}
    snap = Snapshot(now=10.0, cluster=c, jobs=jobs, estimates=ests)
    plan = make_policy("hops").plan(snap)  # with its profiling-first layer
    assert plan.profiling == ()
    assert plan.config_of(JobId("r")) == Configuration.of({"A-0": 4})
    # The paper's profiling-first takes the GPU at the round boundary.
    eager = make_policy("hops:profile_preempt=true").plan(snap)
    assert [(t.job_id, t.server) for t in eager.profiling] == [("new0", "A-0")]
    # Later in the round the running job's GPUs are held: nothing either way.
    later = msgspec.structs.replace(snap, first_plan=False, held={ServerId("A-0"): 4})
    assert profile_first(later, preempt=True)[0] == []


def test_preempting_profiling_still_takes_idle_gpus_first() -> None:
    c = cluster([("A", 2, 4)])
    jobs = (running("r", {"A-0": 4}), *newcomers(1, ["A"]))
    snap = Snapshot(now=10.0, cluster=c, jobs=jobs)
    tasks, left = profile_first(snap, preempt=True)
    assert [(t.job_id, t.server) for t in tasks] == [("new0", "A-1")]
    assert left == {"A-0": 4, "A-1": 3}


def test_a_burst_takes_at_most_the_share_of_each_type() -> None:
    # 4 servers of 8: a quarter is 8 GPUs, one server's worth.
    c = cluster([("A", 4, 8), ("B", 2, 2)])
    snap = Snapshot(now=0.0, cluster=c, jobs=tuple(newcomers(50, ["A", "B"])))
    tasks, left = profile_first(snap)
    by_type = {t: sum(1 for x in tasks if x.gpu_type == t) for t in ("A", "B")}
    # B: a quarter of 4 GPUs is 1, but one server's worth (2) is the floor.
    assert by_type == {"A": 8, "B": 2}
    assert sum(left.values()) == 36 - 10
    # Runs in progress count against the share.
    busy = msgspec.structs.replace(
        snap, held={ServerId("A-0"): 6}, profiling_held={ServerId("A-0"): 6}
    )
    tasks, _ = profile_first(busy)
    assert sum(1 for x in tasks if x.gpu_type == "A") == 2


def test_budget_is_never_negative_and_the_share_is_configurable() -> None:
    c = cluster([("A", 2, 4)])
    assert profiling_budget(c, {ServerId("A-0"): 4, ServerId("A-1"): 4}) == {"A": 0}
    assert profiling_budget(c, {}, share=1.0) == {"A": 8}
    assert profiling_budget(c, {}, share=0.0) == {"A": 4}


def test_a_type_is_busy_when_running_jobs_hold_all_of_it() -> None:
    c = cluster([("A", 2, 4), ("B", 1, 4)])
    assert busy_types(c, {ServerId("A-0"): 4, ServerId("A-1"): 4}) == {"A"}
    assert busy_types(c, {ServerId("A-0"): 4, ServerId("A-1"): 3, ServerId("B-0"): 4}) == {"B"}


def test_a_job_queues_without_busy_types_and_goes_back_for_them() -> None:
    a, b = GpuType("A"), GpuType("B")
    # Profiled on B, A wholly busy, nothing in flight: it queues on B.
    assert queue_without({b}, {a}, {a}, in_flight=False)
    assert not queue_without({b}, {a}, {a}, in_flight=True)
    assert not queue_without(set(), {a, b}, {a, b}, in_flight=False)  # no profile at all
    assert not queue_without({b}, {a}, set(), in_flight=False)  # A has room: wait for it
    # Waiting on B alone, it goes back to profile A once A is not busy.
    assert reprofile({a}, {a}) == frozenset()
    assert reprofile({a}, set()) == {a}


def test_the_live_leader_applies_the_same_rule() -> None:
    a, b = GpuType("A"), GpuType("B")
    queued = msgspec.structs.replace(new_record(state("j", [1]).spec, 0.0), phase="queued",
                                     profiled=(b,))
    need = frozenset({a, b})
    assert profiling_step(queued, need, frozenset({a}), False, False) == (frozenset(), {b})
    assert profiling_step(queued, need, frozenset(), False, False) == ({a}, need)
    # A start in flight: it is about to run, not to profile.
    assert profiling_step(queued, need, frozenset(), False, True) == (frozenset(), need)
