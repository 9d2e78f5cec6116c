"""The Tiresias baseline: queues and thresholds, demotion with preemption,
starvation promotion, FIFO by first start, later plans that only start jobs,
and the 2D-LAS invariant (a job left waiting did not fit what its betters
left) over random queues."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.policies.tiresias.queues import (
    STATE,
    Marks,
    QueueState,
    decode,
    encode,
    queue_index,
)
from scheduling.registry import make_policy, parse_policy
from shared.configuration import Configuration
from shared.ids import JobId
from shared.snapshot import JobState, Plan, Snapshot
from tests.helpers import assert_feasible, cluster, flat_estimate, held_by, state


def job(jid: str, gpus: int, *, submit: float = 0.0, wait_s: float = 0.0,
        service: float = 0.0, running_on: dict[str, int] | None = None) -> JobState:
    base = state(jid, [gpus], submit=submit, wait_s=wait_s)
    if running_on is None:
        return msgspec.structs.replace(base, attained_gpu_s=service)
    return msgspec.structs.replace(base, phase="running", current=Configuration.of(running_on),
                                   attained_gpu_s=service)


def snap(layout: list[tuple[str, int, int]], jobs: Sequence[JobState], now: float = 0.0,
         marks: Mapping[str, Marks] | None = None, first: bool = True) -> Snapshot:
    c = cluster(layout)
    held = {} if first else held_by(jobs)
    ests = {j.id: flat_estimate(j.id, {t.name: 100.0 for t in c.gpu_types}) for j in jobs}
    state_blob = encode(QueueState({JobId(k): m for k, m in (marks or {}).items()}))
    return Snapshot(now=now, cluster=c, jobs=tuple(jobs), estimates=ests, held=held,
                    first_plan=first, layer_state={STATE: state_blob})


def plan_of(s: Snapshot, spec: str = "tiresias") -> Plan:
    plan = make_policy(spec).plan(s)
    assert_feasible(plan, s)
    return plan


def configs(s: Snapshot, spec: str = "tiresias") -> dict[str, str]:
    return {a.job_id: str(a.config) for a in plan_of(s, spec).assignments}


def marks_after(plan: Plan) -> dict[str, Marks]:
    (record,) = [r for r in plan.reasons.layers if r.name == STATE]
    return dict(decode(record.state).jobs)


def test_queue_index_by_threshold() -> None:
    assert queue_index(0.0, (3250.0,)) == 0 and queue_index(3249.9, (3250.0,)) == 0
    assert queue_index(3250.0, (3250.0,)) == 1 and queue_index(1e9, (3250.0,)) == 1
    assert [queue_index(s, (10.0, 100.0)) for s in (5, 10, 99, 100)] == [0, 1, 1, 2]


def test_a_job_past_the_threshold_is_demoted_and_preempted_by_a_new_one() -> None:
    # old ran 1000 s on 4 GPUs: 4000 GPU-s >= 3250, the second queue.
    old = job("old", 4, service=4000.0, running_on={"A-0": 4})
    new = job("new", 4, submit=500.0)
    plan = plan_of(snap([("A", 1, 4)], [old, new], now=1000.0,
                        marks={"old": Marks(0.0, 0.0, 0.0)}))
    assert {a.job_id: str(a.config) for a in plan.assignments} == {"new": "{A-0:4}"}
    assert plan.reasons.priorities == {"old": -1.0, "new": 0.0}
    assert "preempted=1" in plan.reasons.passes[0].formulation
    # Below the threshold it keeps its GPUs (first come by start time).
    young = job("old", 4, service=3000.0, running_on={"A-0": 4})
    assert configs(snap([("A", 1, 4)], [young, new], now=1000.0,
                        marks={"old": Marks(0.0, 0.0, 0.0)})) == {"old": "{A-0:4}"}


def test_a_starving_job_is_promoted_and_its_counts_restart() -> None:
    # old ran 1000 s (4000 GPU-s) since its start and has waited since; new
    # is running in the first queue. At 8 x 1000 s of waiting old is promoted.
    new = job("new", 4, submit=500.0, service=400.0, running_on={"A-0": 4})
    marks = {"old": Marks(0.0, 0.0, 0.0), "new": Marks(0.0, 0.0, 900.0)}
    waited = job("old", 4, service=4000.0, wait_s=7999.0)
    assert configs(snap([("A", 1, 4)], [waited, new], now=10_000.0, marks=marks)) == {
        "new": "{A-0:4}"}
    starved = job("old", 4, service=4000.0, wait_s=8000.0)
    plan = plan_of(snap([("A", 1, 4)], [starved, new], now=10_000.0, marks=marks))
    assert {a.job_id: str(a.config) for a in plan.assignments} == {"old": "{A-0:4}"}
    assert marks_after(plan)["old"] == Marks(4000.0, 8000.0, 0.0, 1)
    assert configs(snap([("A", 1, 4)], [starved, new], now=10_000.0, marks=marks),
                   "tiresias:promote_knob=0") == {"new": "{A-0:4}"}


def test_within_a_queue_first_started_goes_first() -> None:
    # late arrived later but started earlier: it keeps its GPUs.
    late = job("late", 4, submit=100.0, service=40.0, running_on={"A-0": 4})
    early = job("early", 4, submit=0.0, wait_s=200.0)
    plan = plan_of(snap([("A", 1, 4)], [late, early], now=200.0,
                        marks={"late": Marks(0.0, 0.0, 150.0)}))
    assert {a.job_id: str(a.config) for a in plan.assignments} == {"late": "{A-0:4}"}


def test_a_job_that_does_not_fit_is_skipped_and_placement_is_consolidated() -> None:
    jobs = [job("wide", 8, submit=0.0), job("a", 2, submit=1.0), job("b", 3, submit=2.0),
            job("c", 1, submit=3.0)]
    # 6 GPUs on three servers of 2: wide is skipped, a gets one server
    # whole, b needs two servers, c the rest.
    got = configs(snap([("A", 3, 2)], jobs))
    assert got == {"a": "{A-0:2}", "b": "{A-1:2, A-2:1}", "c": "{A-2:1}"}


def test_a_later_plan_starts_jobs_without_preempting() -> None:
    old = job("old", 4, service=4000.0, running_on={"A-0": 4})
    jobs = [old, job("new", 4, submit=1.0), job("one", 1, submit=2.0)]
    s = snap([("A", 2, 4)], jobs, now=100.0, marks={"old": Marks(0.0, 0.0, 0.0)}, first=False)
    plan = plan_of(s)
    assert {a.job_id: str(a.config) for a in plan.assignments} == {"new": "{A-1:4}"}
    assert marks_after(plan)["new"] == Marks(0.0, 0.0, 100.0)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="threshold_gpu_s"):
        parse_policy("tiresias:threshold_gpu_s=0")
    with pytest.raises(ValueError, match="takes no setting priority"):
        parse_policy("tiresias:priority=las")


# --- the 2D-LAS invariant ----------------------------------------------------------


@st.composite
def queues(draw: st.DrawFn) -> tuple[int, list[JobState], dict[str, Marks]]:
    size = draw(st.integers(2, 16))
    jobs: list[JobState] = []
    marks: dict[str, Marks] = {}
    used = 0
    for i in range(draw(st.integers(1, 10))):
        gpus = draw(st.integers(1, size))
        service = float(draw(st.sampled_from([0, 1000, 5000])))
        runs = used + gpus <= size and draw(st.booleans())
        if runs:  # the running jobs share the one server
            j = job(f"j{i}", gpus, submit=float(i), service=service, running_on={"A-0": gpus})
            used += gpus
        else:
            j = job(f"j{i}", gpus, submit=float(i), service=service,
                    wait_s=float(draw(st.integers(0, 100))))
        if service or runs:
            marks[j.id] = Marks(0.0, 0.0, float(draw(st.integers(0, 50))))
        jobs.append(j)
    return size, jobs, marks


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queues())
def test_a_job_left_waiting_did_not_fit_what_its_betters_left(
        scene: tuple[int, list[JobState], dict[str, Marks]]) -> None:
    # One server: placement never fragments, so the plan is the skip-if-
    # it-does-not-fit walk of the queues: a job left out asks for more than
    # the GPUs left idle plus those of every job after it that got some.
    size, jobs, marks = scene
    s = snap([("A", 1, size)], jobs, now=1000.0, marks=marks)
    plan = plan_of(s)
    given_gpus = {a.job_id: a.config.total_gpus for a in plan.assignments}
    idle = size - sum(given_gpus.values())
    prios = plan.reasons.priorities
    order = sorted(prios, key=lambda j: -prios[j])  # queues only: ties below
    gpus = {j.id: j.spec.requirements[0] for j in jobs}
    for jid in order:
        if jid in given_gpus:
            continue
        assert gpus[jid] > idle  # work-conserving
        worse = [k for k in given_gpus if prios[k] < prios[jid]]
        assert gpus[jid] > idle + sum(given_gpus[k] for k in worse), (jid, given_gpus)


def test_a_job_fragmentation_leaves_out_gives_its_turn_to_the_next() -> None:
    # w's count fits the 4 free GPUs, but only over two servers, and w has no
    # distributed curve: it cannot run there, so x takes its turn.
    jobs = [job("r1", 2, service=10.0, running_on={"A-0": 2}),
            job("r2", 2, service=10.0, running_on={"A-1": 2}),
            job("w", 4, submit=1.0), job("x", 2, submit=2.0)]
    s = snap([("A", 2, 4)], jobs, now=10.0,
             marks={"r1": Marks(0.0, 0.0, 0.0), "r2": Marks(0.0, 0.0, 1.0)})
    est = s.estimates[JobId("w")]
    local = {t: msgspec.structs.replace(c, dist=()) for t, c in est.by_type.items()}
    s = msgspec.structs.replace(s, estimates={
        **s.estimates, JobId("w"): msgspec.structs.replace(est, by_type=local)})
    assert configs(s) == {"r1": "{A-0:2}", "r2": "{A-1:2}", "x": "{A-0:2}"}
