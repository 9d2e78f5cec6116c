"""The Sia baseline: hand-checked cases of its type-level ILP and Placer, and
invariants on random snapshots."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.policies.sia.goodput import restart_factor
from scheduling.policies.sia.policy import SiaPolicy, SiaSettings, coefficient
from scheduling.policy import Policy
from scheduling.registry import make_policy
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve, config_throughput
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import JobState, Plan, Snapshot
from tests.helpers import assert_feasible, cluster, flat_estimate, layouts, state, untimed

NOW = 1000.0
ESTIMATOR = SiaSettings(throughput="estimator")  # Hops' estimator's curves, not Sia's own


def snap(
    c: Cluster,
    jobs: list[JobState],
    estimates: dict[str, JobEstimate] | None = None,
    held: Mapping[str, int] | None = None,
    first_plan: bool = True,
) -> Snapshot:
    ests = {
        j.id: flat_estimate(j.id, {t.name: 100.0 for t in c.gpu_types})
        for j in jobs
        if j.phase != "profiling"
    }
    ests.update({JobId(k): v for k, v in (estimates or {}).items()})
    return Snapshot(
        now=NOW,
        cluster=c,
        jobs=tuple(jobs),
        estimates=ests,
        held={ServerId(k): v for k, v in (held or {}).items()},
        first_plan=first_plan,
    )


def running(job_id: str, reqs: list[int], parts: dict[str, int], restarts: int = 0) -> JobState:
    return JobState(
        spec=state(job_id, reqs).spec,
        phase="running",
        current=Configuration.of(parts),
        restarts=restarts,
    )


def assigned(plan: Plan) -> dict[str, dict[str, int]]:
    return {a.job_id: dict(a.config.parts) for a in plan.assignments}


# ------------------------------------------------------------- hand-checked


def test_objective_pieces_match_the_artifact() -> None:
    s = SiaSettings()
    # 4^-0.5 = 0.5 against lambda = 1.1; 3^-0.5 = 0.577 rounds to 0.58.
    assert coefficient(4.0, s) == pytest.approx(0.6)
    assert coefficient(3.0, s) == pytest.approx(0.52)
    # A goodput so low that allocating costs more than leaving the job out.
    assert coefficient(0.5, s) is None
    # Sia Eq. (2): (T - N*S) / (T + S), and 1 while T < S.
    job = running("r", [2], {"A-0": 2}, restarts=3)
    assert restart_factor(job, NOW, 30.0) == pytest.approx((1000 - 90) / 1030)
    assert restart_factor(job, 20.0, 30.0) == 1.0


def test_capacity_forces_a_choice_and_the_queue_breaks_the_tie() -> None:
    # Both rigid jobs are worth 1.1 - 4^-0.5 = 0.6 and only one fits: Sia's
    # objective is indifferent, the latency-ratio queue decides.
    c = cluster([("A", 1, 4)])
    jobs = [state("short-wait", [4], wait_s=100.0), state("long-wait", [4], wait_s=5000.0)]
    plan = SiaPolicy().plan(snap(c, jobs))
    assert assigned(plan) == {"long-wait": {"A-0": 4}}
    prios = plan.reasons.priorities
    assert prios[JobId("long-wait")] > prios[JobId("short-wait")]
    assert plan.reasons.passes[0].assigned == ("long-wait",)


def test_each_rigid_job_goes_to_the_type_it_gains_most_from() -> None:
    # G_x = (A: 4, B: 12), G_y = (A: 4, B: 4.8) after scaling each row's
    # minimum to R_1 = 4. x->B, y->A saves (1.1-0.29) + (1.1-0.5) = 1.41;
    # x->A, y->B saves 0.6 + (1.1-0.46) = 1.24.
    c = cluster([("A", 1, 4), ("B", 1, 4)])
    jobs = [state("x", [4]), state("y", [4])]
    ests = {
        "x": flat_estimate("x", {"A": 100.0, "B": 300.0}),
        "y": flat_estimate("y", {"A": 100.0, "B": 120.0}),
    }
    plan = SiaPolicy().plan(snap(c, jobs, ests))
    assert assigned(plan) == {"x": {"B-0": 4}, "y": {"A-0": 4}}


def test_negative_p_gives_more_jobs_some_gpus() -> None:
    # Only F's 4 GPUs are free; S is busy but still sets each row's minimum.
    # Normalised goodputs on F: a (2: 3, 4: 6), b (2: 2, 4: 4).
    # p = -0.5: a2 + b2 saves (1.1-0.58) + (1.1-0.71) = 0.91 > a4's 0.69.
    # p = 1, lambda = 0 (max sum of goodput): a4 = 6 > a2 + b2 = 5.
    c = cluster([("S", 1, 4), ("F", 1, 4)])
    jobs = [state("a", [2, 4]), state("b", [2, 4])]
    ests = {
        "a": flat_estimate("a", {"S": 100.0, "F": 150.0}, scaling=1.0),
        "b": flat_estimate("b", {"S": 100.0, "F": 100.0}, scaling=1.0),
    }
    s = snap(c, jobs, ests, held={"S-0": 4})
    fair = SiaPolicy().plan(s)
    assert assigned(fair) == {"a": {"F-0": 2}, "b": {"F-0": 2}}
    greedy = SiaPolicy(SiaSettings(p=1.0, lam=0.0)).plan(s)
    assert assigned(greedy) == {"a": {"F-0": 4}}


def test_restart_factor_keeps_a_job_that_restarts_too_often() -> None:
    # Growing from 2 to 4 GPUs raises G from 2 to 3.8. After 30 restarts of
    # 30 s in 1000 s, r = 100/1030 and 4 GPUs would be worth G' = 0.37: the
    # job keeps its allocation, on the same server.
    c = cluster([("A", 2, 4)])
    calm = SiaPolicy().plan(snap(c, [running("r", [2, 4], {"A-1": 2})]))
    assert sum(assigned(calm)["r"].values()) == 4
    restless = SiaPolicy().plan(snap(c, [running("r", [2, 4], {"A-1": 2}, restarts=30)]))
    assert assigned(restless) == {"r": {"A-1": 2}}


def test_restart_factor_takes_each_jobs_own_restart_cost() -> None:
    # Three restarts in 1000 s: at 30 s each, r = 910/1030 and the job grows
    # to 4 GPUs; at an ImageNet model's 250 s, r = 250/1250 and it stays.
    c = cluster([("A", 2, 4)])
    cheap = running("r", [2, 4], {"A-1": 2}, restarts=3)
    assert sum(assigned(SiaPolicy().plan(snap(c, [cheap])))["r"].values()) == 4
    dear = msgspec.structs.replace(cheap, restart_s=250.0)
    assert assigned(SiaPolicy().plan(snap(c, [dear]))) == {"r": {"A-1": 2}}
    uniform = SiaPolicy(SiaSettings(restart_penalty=30.0)).plan(snap(c, [dear]))
    assert sum(assigned(uniform)["r"].values()) == 4  # the operator's S for every job


def test_sia_is_blind_to_server_entities() -> None:
    # Two servers of one type; by_server makes one of them half as fast. The
    # decision and the recorded throughput are the same whichever is slower.
    c = cluster([("A", 2, 8)])
    base = flat_estimate("j", {"A": 100.0})
    slow = ThroughputCurve(agg=tuple(v / 2 for v in base.by_type[GpuType("A")].agg))
    plans = []
    for slow_server in ("A-0", "A-1"):
        est = msgspec.structs.replace(base, by_server={ServerId(slow_server): slow})
        plans.append(SiaPolicy(ESTIMATOR).plan(snap(c, [state("j", [8])], {"j": est})))
    assert plans[0].assignments == plans[1].assignments
    (a,) = plans[0].assignments
    assert a.config == Configuration.of({"A-0": 8})  # best-fit tie: cluster order
    assert a.throughput == pytest.approx(config_throughput(base, c, a.config))


def test_server_fragmentation_defeats_the_type_level_allocation() -> None:
    # 8 GPUs of A are free in total, but 4 per server: the ILP allocates the
    # 8-GPU job, which fits no single server, so it gets nothing.
    c = cluster([("A", 2, 8)])
    plan = SiaPolicy().plan(snap(c, [state("j", [8])], held={"A-0": 4, "A-1": 4}))
    assert plan.assignments == ()
    (stats,) = plan.reasons.passes
    assert stats.assigned == ()
    assert stats.formulation.endswith("unplaced=1 (j)")


def test_placer_evicts_kept_jobs_when_they_block_a_new_one() -> None:
    # k and m keep 2 GPUs each on different servers, which leaves no server
    # for d's 4. Repacking (Sia's "evict and try again") places all three.
    c = cluster([("A", 2, 4)])
    jobs = [running("k", [2], {"A-0": 2}), running("m", [2], {"A-1": 2}), state("d", [4])]
    plan = SiaPolicy().plan(snap(c, jobs))
    got = assigned(plan)
    assert got["d"] == {"A-0": 4}
    assert got["k"] == {"A-1": 2} and got["m"] == {"A-1": 2}


def test_distributed_allocation_takes_whole_nodes() -> None:
    c = cluster([("A", 3, 4)])
    plan = SiaPolicy().plan(snap(c, [state("j", [8])]))
    assert assigned(plan) == {"j": {"A-1": 4, "A-2": 4}}


def test_later_plans_in_a_round_only_serve_profiling() -> None:
    c = cluster([("A", 1, 8)])
    jobs = [state("q", [2]), state("p", [1], phase="profiling", unprofiled=["A"])]
    plan = make_policy("sia").plan(snap(c, jobs, first_plan=False))  # profiling-first layer
    assert plan.assignments == ()
    assert [t.job_id for t in plan.profiling] == ["p"]
    assert plan.reasons.policy == "sia" and plan.reasons.passes == ()


def test_sia_is_a_policy() -> None:
    policy: Policy = SiaPolicy()
    assert policy.name == "sia"


def test_settings_reject_a_zero_p() -> None:
    with pytest.raises(ValueError):
        SiaSettings(p=0.0)


# ---------------------------------------------------------------- invariants

job_specs = st.lists(
    st.tuples(
        st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]), min_size=1, max_size=4),
        st.floats(0, 10_000),
        st.sampled_from(["queued", "running", "profiling"]),
        st.integers(0, 5),
    ),
    min_size=1,
    max_size=10,
)


def _current(c: Cluster, reqs: list[int], pick: int) -> Configuration | None:
    """A single-server configuration of the job's smallest requirement."""
    fits = [s for s in c.servers if s.gpus >= min(reqs)]
    return Configuration.of({fits[pick % len(fits)].id: min(reqs)}) if fits else None


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    c = cluster(draw(layouts))
    jobs: list[JobState] = []
    for i, (reqs, wait, phase, restarts) in enumerate(draw(job_specs)):
        base = state(f"j{i}", reqs, wait_s=wait, phase=phase,  # type: ignore[arg-type]
                     unprofiled=[c.gpu_types[0].name] if phase == "profiling" else [])
        current = _current(c, reqs, i) if phase == "running" else None
        jobs.append(msgspec.structs.replace(base, current=current, restarts=restarts))
    ests = {
        f"j{i}": flat_estimate(f"j{i}", {t.name: draw(st.sampled_from([50.0, 100.0, 200.0]))
                                         for t in c.gpu_types},
                               rho=draw(st.sampled_from([1.0, 1.5])))
        for i in range(len(jobs))
    }
    held: dict[str, int] = {s.id: draw(st.integers(0, s.gpus // 2)) for s in c.servers}
    return snap(c, jobs, ests, held=held, first_plan=draw(st.booleans()))






def with_entities(s: Snapshot) -> Snapshot:
    """The same snapshot with a per-server curve, twice as fast, on every server."""
    ests = {}
    for jid, est in s.estimates.items():
        by_server = {
            srv.id: ThroughputCurve(
                agg=tuple(2 * v for v in est.by_type[srv.gpu_type].agg),
                dist=tuple(2 * v for v in est.by_type[srv.gpu_type].dist),
            )
            for srv in s.cluster.servers[::2]
        }
        ests[jid] = msgspec.structs.replace(est, by_server=by_server)
    return msgspec.structs.replace(s, estimates=ests)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_plan_invariants(s: Snapshot) -> None:
    assert_feasible(SiaPolicy().plan(s), s)  # its own bootstrapped model
    plan = SiaPolicy(ESTIMATOR).plan(s)
    assert_feasible(plan, s)
    by_id = {j.id: j for j in s.jobs}
    for a in plan.assignments:
        job = by_id[a.job_id]
        assert job.phase in ("queued", "running")
        assert len({s.cluster.by_id[sid].gpu_type for sid in a.config.servers}) == 1
        assert a.throughput == pytest.approx(config_throughput(s.estimates[a.job_id],
                                                               s.cluster, a.config))
    if not s.first_plan:
        assert plan.assignments == ()
    assert untimed(SiaPolicy(ESTIMATOR).plan(s)) == untimed(plan)
    # Per-server curves change nothing: Sia sees GPU types only.
    assert untimed(SiaPolicy(ESTIMATOR).plan(with_entities(s))) == untimed(plan)
