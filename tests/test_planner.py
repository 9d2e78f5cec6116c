"""The Hops policy end to end on small snapshots: worked cases and invariants."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.registry import make_policy
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.snapshot import JobState, Snapshot
from tests.helpers import assert_feasible, cluster, flat_estimate, layouts, state, untimed, used


def snapshot(
    c: Cluster,
    jobs: list[JobState],
    rho: dict[str, float] | None = None,
    **kw: object,
) -> Snapshot:
    rho = rho or {}
    ests = {
        j.id: flat_estimate(j.id, {t.name: 100.0 for t in c.gpu_types}, rho=rho.get(j.id, 1.0))
        for j in jobs
        if j.phase != "profiling"
    }
    return Snapshot(now=1000.0, cluster=c, jobs=tuple(jobs), estimates=ests, **kw)  # type: ignore[arg-type]




def test_single_job_gets_its_largest_fitting_requirement() -> None:
    c = cluster([("A", 1, 8)])
    plan = HopsPolicy().plan(snapshot(c, [state("j", [1, 2, 4])]))
    assert plan.config_of(JobId("j")) == Configuration.of({"A-0": 4})
    assert plan.reasons.window == ("j",)
    assert plan.reasons.passes[0].kind == "first"


def test_latency_ratio_rescues_the_starving_job() -> None:
    # One 4-GPU server, two jobs that each need all of it. The job that has
    # waited a larger share of its lifetime wins, whatever its submission time.
    c = cluster([("A", 1, 4)])
    jobs = [
        state("early-short-wait", [4], wait_s=100.0, submit=0.0),
        state("late-long-wait", [4], wait_s=5000.0, submit=50.0),
    ]
    plan = HopsPolicy().plan(snapshot(c, jobs))
    assert [a.job_id for a in plan.assignments] == ["late-long-wait"]
    fifo = HopsPolicy(HopsSettings(priority="fifo")).plan(snapshot(c, jobs))
    assert [a.job_id for a in fifo.assignments] == ["early-short-wait"]


def test_profiling_queue_is_served_before_planning() -> None:
    c = cluster([("A", 1, 4), ("B", 1, 4)])
    jobs = [
        state("new", [1], phase="profiling", unprofiled=["A", "B"]),
        state("old", [4, 3]),
    ]
    plan = make_policy("hops").plan(snapshot(c, jobs))  # with its profiling-first layer
    assert {(t.gpu_type, t.server) for t in plan.profiling} == {("A", "A-0"), ("B", "B-0")}
    # 'old' can no longer take 4 GPUs on one server; 3 still fit.
    cfg = plan.config_of(JobId("old"))
    assert cfg is not None and cfg.total_gpus == 3


def test_fill_plan_uses_fragments_with_a_low_sensitivity_job() -> None:
    # Idle GPUs: 4 on A-0, 2 on A-1 and 2 on A-2 (the rest held by running
    # jobs). Two placement-sensitive 4-GPU jobs head the queue and fill the
    # window (4 + 4 >= 8); only one of them fits (on A-0). The adjustment sees
    # rho_set = 3 > rho_queue = (3 + 3 + 1.05) / 3 and admits the tolerant job
    # from behind the window, which takes the two 2-GPU fragments.
    c = cluster([("A", 3, 8)])
    jobs = [
        state("sensitive", [4], wait_s=900.0),
        state("sensitive2", [4], wait_s=800.0),
        state("tolerant", [4], wait_s=10.0),
    ]
    snap = snapshot(
        c,
        jobs,
        rho={"sensitive": 3.0, "sensitive2": 3.0, "tolerant": 1.05},
        held={ServerId("A-0"): 4, ServerId("A-1"): 6, ServerId("A-2"): 6},
        first_plan=False,
    )
    plan = HopsPolicy().plan(snap)
    assert plan.reasons.window == ("sensitive", "sensitive2")
    assert plan.reasons.admitted_by_adjustment == ("tolerant",)
    assert plan.config_of(JobId("sensitive")) == Configuration.of({"A-0": 4})
    assert plan.config_of(JobId("tolerant")) == Configuration.of({"A-1": 2, "A-2": 2})
    assert plan.config_of(JobId("sensitive2")) is None
    assert len(plan.reasons.passes) == 1 and plan.reasons.passes[0].kind == "fill"


def test_fragment_window_skips_jobs_that_cannot_use_the_fragments() -> None:
    # Two servers with 2 idle GPUs each. The head job needs 4 GPUs on one
    # server (placement-sensitive), which no fragment can give; it does not
    # hold the window, so the tolerant job behind it is planned in the first pass.
    c = cluster([("A", 2, 8)])
    jobs = [state("sensitive", [4], wait_s=900.0), state("tolerant", [4], wait_s=10.0)]
    snap = snapshot(
        c,
        jobs,
        rho={"sensitive": 3.0, "tolerant": 1.05},
        held={ServerId("A-0"): 6, ServerId("A-1"): 6},
        first_plan=False,
    )
    plan = HopsPolicy().plan(snap)
    assert plan.reasons.window == ("tolerant",)
    assert plan.config_of(JobId("tolerant")) == Configuration.of({"A-0": 2, "A-1": 2})


def test_fill_plan_leaves_running_jobs_alone() -> None:
    c = cluster([("A", 1, 8)])
    running = JobState(
        spec=state("r", [4]).spec, phase="running", current=Configuration.of({"A-0": 4})
    )
    snap = snapshot(c, [running, state("q", [2, 4])], held={ServerId("A-0"): 4}, first_plan=False)
    plan = HopsPolicy().plan(snap)
    assert [a.job_id for a in plan.assignments] == ["q"]
    assert used(plan)["A-0"] == 4


# ---------------------------------------------------------------- invariants

job_specs = st.lists(
    st.tuples(
        st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), min_size=1, max_size=4),
        st.floats(0, 10_000),
        st.sampled_from([1.0, 1.2, 2.5]),
        st.sampled_from(["queued", "running", "profiling"]),
    ),
    min_size=1,
    max_size=10,
)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    c = cluster(draw(layouts))
    specs = draw(job_specs)
    jobs = [
        state(f"j{i}", reqs, wait_s=wait, phase=phase,  # type: ignore[arg-type]
              unprofiled=[c.gpu_types[0].name] if phase == "profiling" else [])
        for i, (reqs, wait, _, phase) in enumerate(specs)
    ]
    rho = {f"j{i}": r for i, (_, _, r, _) in enumerate(specs)}
    first = draw(st.booleans())
    held = {}
    if not first:
        held = {s.id: draw(st.integers(0, s.gpus)) for s in c.servers}
    return snapshot(c, jobs, rho=rho, held=held, first_plan=first)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from([0.0, 1.0, 2.0, float("inf")]))
def test_plan_invariants(snap: Snapshot, lam: float) -> None:
    plan = HopsPolicy(HopsSettings(lam=lam)).plan(snap)
    # No server over-allocated, one configuration per job from its set.
    assert_feasible(plan, snap)
    by_id = {j.id: j for j in snap.jobs}
    for a in plan.assignments:
        job = by_id[a.job_id]
        assert job.phase == "queued" or (snap.first_plan and job.phase == "running")
    # The same input gives the same plan (all but the solver's wall time).
    assert untimed(HopsPolicy(HopsSettings(lam=lam)).plan(snap)) == untimed(plan)




def test_running_job_moves_only_when_the_gain_pays_for_the_restart() -> None:
    # A running job on A-0; server B-0 is 5% faster for it; a restart costs
    # 30 s. Over a round the restart is 10%: it stays. Over the rest of the
    # job (1e6 samples at 380/s, about 2,600 s) it is 1.2%: it moves, unless
    # the job is near its end. With no restart cost it always moves.
    c = cluster([("A", 1, 4), ("B", 1, 4)])
    spec = state("r", [4]).spec
    running = JobState(spec=spec, phase="running", current=Configuration.of({"A-0": 4}))
    est = flat_estimate("r", {"A": 100.0, "B": 105.0})
    snap = Snapshot(now=0.0, cluster=c, jobs=(running,), estimates={JobId("r"): est})
    on_a, on_b = Configuration.of({"A-0": 4}), Configuration.of({"B-0": 4})
    myopic = HopsPolicy(HopsSettings(reconfig_horizon="round"))
    assert myopic.plan(snap).config_of(JobId("r")) == on_a
    assert HopsPolicy().plan(snap).config_of(JobId("r")) == on_b
    ending = msgspec.structs.replace(running, done_samples=spec.total_samples - 100_000)
    near_end = msgspec.structs.replace(snap, jobs=(ending,))
    assert HopsPolicy().plan(near_end).config_of(JobId("r")) == on_a
    eager = HopsPolicy(HopsSettings(reconfig_cost=0.0))
    assert eager.plan(near_end).config_of(JobId("r")) == on_b


def test_a_job_that_just_restarted_keeps_its_gpus_until_it_paid_for_the_restart() -> None:
    # B-0 is twice as fast for the running job, but it (re)started 60 s ago
    # and a restart costs it 30 s: exempt for 10 x 30 s, it stays on A-0.
    c = cluster([("A", 1, 4), ("B", 1, 4)])
    running = JobState(spec=state("r", [4]).spec, phase="running",
                       current=Configuration.of({"A-0": 4}), throughput_since=540.0)
    est = flat_estimate("r", {"A": 100.0, "B": 200.0})
    snap = Snapshot(now=600.0, cluster=c, jobs=(running,), estimates={JobId("r"): est})
    assert HopsPolicy().plan(snap).config_of(JobId("r")) == Configuration.of({"A-0": 4})
    later = msgspec.structs.replace(snap, now=900.0)  # 360 s on: no longer exempt
    assert HopsPolicy().plan(later).config_of(JobId("r")) == Configuration.of({"B-0": 4})
    paper = HopsPolicy(HopsSettings(preempt_exempt=0.0))
    assert paper.plan(snap).config_of(JobId("r")) == Configuration.of({"B-0": 4})
    fill = msgspec.structs.replace(snap, first_plan=False, held={ServerId("A-0"): 4})
    assert HopsPolicy().plan(fill).assignments == ()  # a later plan leaves running jobs alone
    # A GPU of it taken outside the policy (profiling that preempts) ends
    # the exemption: the plan never keeps it on a GPU it no longer has.
    taken = msgspec.structs.replace(snap, held={ServerId("A-0"): 1})
    assert HopsPolicy().plan(taken).config_of(JobId("r")) == Configuration.of({"B-0": 4})
