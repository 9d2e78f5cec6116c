"""The Gavel baseline: hand-checked LP allocations, the round-robin, rigid
sizes, entity blindness, and plan invariants over random snapshots."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.policies.gavel.lp import rigid_requirement
from scheduling.policies.gavel.policy import GavelPolicy, GavelRound, GavelSettings
from scheduling.registry import make_policy
from shared.cluster import Cluster, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.snapshot import JobState, Plan, Snapshot
from tests.helpers import cluster, flat_estimate, state

ROUND_S = 360.0
V, K = GpuType("V100"), GpuType("K80")


def snap(
    c: Cluster,
    jobs: Sequence[JobState],
    speeds: dict[str, dict[str, float]] | None = None,
    **kw: object,
) -> Snapshot:
    """Every job runs at 100 samples/s per GPU on every type unless ``speeds``
    says otherwise."""
    speeds = speeds or {}
    default: dict[str, float] = {t.name: 100.0 for t in c.gpu_types}
    ests = {
        j.id: flat_estimate(j.id, speeds.get(j.id, default))
        for j in jobs
        if j.phase != "profiling"
    }
    return Snapshot(cluster=c, jobs=tuple(jobs), estimates=ests, **kw)  # type: ignore[arg-type]


def x_of(r: GavelRound, job: str, gpu_type: GpuType) -> float:
    return r.allocation[JobId(job)][gpu_type]


def without_timing(plan: Plan) -> Plan:
    passes = tuple(msgspec.structs.replace(p, solve_s=0.0) for p in plan.reasons.passes)
    return msgspec.structs.replace(
        plan, reasons=msgspec.structs.replace(plan.reasons, passes=passes)
    )


# --- rigid size -----------------------------------------------------------------


def test_rigid_requirement_is_the_lower_median() -> None:
    def spec(**kw: object) -> JobSpec:
        return JobSpec(id=JobId("j"), model="m", batch_size=8, params=10, total_samples=10,
                       **kw)  # type: ignore[arg-type]

    assert rigid_requirement(spec(requirements=(1, 2, 4)), 8) == 2
    assert rigid_requirement(spec(requirements=(8, 1, 4, 2)), 8) == 2
    assert rigid_requirement(spec(requirements=(3,)), 8) == 3
    # Bounds 1..16 in 8 steps: {1, 3, 5, 7, 10, 12, 14, 16} -> 7.
    assert rigid_requirement(spec(min_gpus=1, max_gpus=16), 8) == 7


def test_plan_uses_the_rigid_size_even_when_more_is_free() -> None:
    c = cluster([("V100", 1, 8)])
    r = GavelPolicy().decide(snap(c, [state("j", [1, 2, 4, 8])], now=0.0))
    cfg = r.plan.config_of(JobId("j"))
    assert cfg == Configuration.of({"V100-0": 2})
    assert r.rigid == {"j": 2}


# --- the allocation LP (hand-checked) ---------------------------------------------


def test_lp_gives_the_fast_type_to_the_job_that_gains_from_it() -> None:
    # One V100 and one K80. A is 4x faster on the V100, B no faster. B's
    # normalised throughput is 1 wherever it runs, so the max-min level is 1;
    # among the allocations at that level, A on the V100 all the time is the
    # efficient one: X_A = (1, 0), X_B = (0, 1).
    c = cluster([("V100", 1, 1), ("K80", 1, 1)])
    speeds = {"A": {"V100": 4.0, "K80": 1.0}, "B": {"V100": 1.0, "K80": 1.0}}
    r = GavelPolicy().decide(snap(c, [state("A", [1]), state("B", [1])], speeds, now=0.0))
    assert x_of(r, "A", V) == pytest.approx(1.0, abs=1e-6)
    assert x_of(r, "A", K) == pytest.approx(0.0, abs=1e-6)
    assert x_of(r, "B", V) == pytest.approx(0.0, abs=1e-6)
    assert x_of(r, "B", K) == pytest.approx(1.0, abs=1e-6)
    assert r.plan.reasons.passes[0].objective == pytest.approx(1.0)
    assert r.plan.config_of(JobId("A")) == Configuration.of({"V100-0": 1})
    assert r.plan.config_of(JobId("B")) == Configuration.of({"K80-0": 1})


def test_lp_equalises_normalised_throughput() -> None:
    # B is 1.2x faster on the V100. Proportional throughputs (half of each
    # type): P_A = 2.5, P_B = 1.1. Max-min needs 4a_v + a_k >= 2.5z and
    # 1.2b_v + b_k >= 1.1z; with one GPU per type the optimum z = 1 is the
    # equal split, and it is unique (z = 1 forces b_v = a_v = 1/2).
    c = cluster([("V100", 1, 1), ("K80", 1, 1)])
    speeds = {"A": {"V100": 4.0, "K80": 1.0}, "B": {"V100": 1.2, "K80": 1.0}}
    r = GavelPolicy().decide(snap(c, [state("A", [1]), state("B", [1])], speeds, now=0.0))
    for job in ("A", "B"):
        for t in (V, K):
            assert x_of(r, job, t) == pytest.approx(0.5, abs=1e-6)


def test_lp_raises_the_bottleneck_job_not_the_total() -> None:
    # One V100, two K80s: shares 1/3 and 2/3, P_A = 2, P_B = 3.2/3. With
    # b_v = d: A = (4 - 3d)/2 and B = 3(1 + 0.2d)/3.2, equal at d = 17/27,
    # z = 57/54. Max-min hands most of the V100 to B, the job furthest behind.
    c = cluster([("V100", 1, 1), ("K80", 2, 1)])
    speeds = {"A": {"V100": 4.0, "K80": 1.0}, "B": {"V100": 1.2, "K80": 1.0}}
    r = GavelPolicy().decide(snap(c, [state("A", [1]), state("B", [1])], speeds, now=0.0))
    assert x_of(r, "B", V) == pytest.approx(17 / 27, abs=1e-6)
    assert x_of(r, "A", V) == pytest.approx(10 / 27, abs=1e-6)
    assert x_of(r, "A", K) == pytest.approx(17 / 27, abs=1e-6)
    assert r.plan.reasons.passes[0].objective == pytest.approx(57 / 54, rel=1e-6)


def test_scale_factors_equalise_gpu_time() -> None:
    # One 4-GPU server; A needs 2 GPUs, B 4. Gavel multiplies by the scale
    # factor: max min(2 x_A, 4 x_B) s.t. 2 x_A + 4 x_B <= 4 -> x_A = 1,
    # x_B = 1/2, two GPU-rounds each.
    c = cluster([("V100", 1, 4)])
    r = GavelPolicy().decide(snap(c, [state("A", [2]), state("B", [4])], now=0.0))
    assert x_of(r, "A", V) == pytest.approx(1.0, abs=1e-6)
    assert x_of(r, "B", V) == pytest.approx(0.5, abs=1e-6)


def test_latency_ratio_weights_the_shares() -> None:
    # Same job, same age; A has waited 3x as long, so its weight is 3x B's
    # (bias 0: both ratios positive) and x_A / 3 = x_B / 1 with x_A + x_B = 1.
    c = cluster([("V100", 1, 1)])
    jobs = [state("A", [1], wait_s=300.0), state("B", [1], wait_s=100.0)]
    r = GavelPolicy().decide(snap(c, jobs, now=1000.0))
    assert x_of(r, "A", V) == pytest.approx(0.75, abs=1e-6)
    assert x_of(r, "B", V) == pytest.approx(0.25, abs=1e-6)
    prios = r.plan.reasons.priorities
    assert prios[JobId("A")] == pytest.approx(3 * prios[JobId("B")])
    flat = GavelPolicy(GavelSettings(lam=0.0)).decide(snap(c, jobs, now=1000.0))
    assert x_of(flat, "A", V) == pytest.approx(0.5, abs=1e-6)


# --- the round-robin ---------------------------------------------------------------


def advance(s: Snapshot, plan: Plan) -> Snapshot:
    """One round later: jobs in the plan ran it, the others waited."""
    jobs = []
    for j in s.jobs:
        cfg = plan.config_of(j.id)
        if j.phase == "profiling":
            jobs.append(j)
        elif cfg is None:
            jobs.append(msgspec.structs.replace(j, phase="queued", current=None,
                                                wait_s=j.wait_s + ROUND_S))
        else:
            jobs.append(ran(s.cluster, j, cfg))
    return msgspec.structs.replace(s, now=s.now + ROUND_S, jobs=tuple(jobs))


def ran(c: Cluster, j: JobState, cfg: Configuration) -> JobState:
    t = c.by_id[cfg.parts[0][0]].gpu_type
    got = dict(j.attained_by_type)
    got[t] = got.get(t, 0.0) + ROUND_S
    return msgspec.structs.replace(j, phase="running", current=cfg, attained_by_type=got)


def test_round_robin_alternates_two_jobs_sharing_a_type() -> None:
    c = cluster([("V100", 1, 4)])
    s = snap(c, [state("A", [4]), state("B", [4])], now=0.0)
    policy = GavelPolicy()
    ran = []
    for _ in range(6):
        r = policy.decide(s)
        assert len(r.plan.assignments) == 1
        ran.append(r.plan.assignments[0].job_id)
        loser = "B" if ran[-1] == "A" else "A"
        assert r.skipped == {loser: "no_room"}
        s = advance(s, r.plan)
    assert ran == ["A", "B", "A", "B", "A", "B"]


def test_job_behind_its_share_goes_first() -> None:
    # X = 1/2 each; A has run 3 of 4 rounds, B 1: B's priority 0.5/0.25 beats
    # A's 0.5/0.75.
    c = cluster([("V100", 1, 1)])
    a = msgspec.structs.replace(state("A", [1]), attained_by_type={V: 3 * ROUND_S})
    b = msgspec.structs.replace(state("B", [1]), attained_by_type={V: ROUND_S})
    r = GavelPolicy(GavelSettings(lam=0.0)).decide(snap(c, [a, b], now=4 * ROUND_S))
    assert r.round_priority[JobId("B")][V] == pytest.approx(2.0, rel=1e-6)
    assert r.round_priority[JobId("A")][V] == pytest.approx(2 / 3, rel=1e-6)
    assert [x.job_id for x in r.plan.assignments] == ["B"]


def test_running_job_stays_on_its_servers() -> None:
    c = cluster([("V100", 2, 4)])
    here = Configuration.of({"V100-1": 4})
    running = msgspec.structs.replace(state("R", [4]), phase="running", current=here,
                                      attained_by_type={V: ROUND_S})
    r = GavelPolicy().decide(snap(c, [running, state("N", [4])], now=2 * ROUND_S))
    assert r.plan.config_of(JobId("R")) == here
    assert r.plan.config_of(JobId("N")) == Configuration.of({"V100-0": 4})


def test_multi_gpu_jobs_are_consolidated_first() -> None:
    # Two 4-GPU servers; jobs of 4, 2 and 2 GPUs all fit, the 4 on its own
    # server and the two 2s together on the other.
    c = cluster([("V100", 2, 4)])
    jobs = [state("a", [2]), state("b", [2]), state("c", [4])]
    plan = GavelPolicy().plan(snap(c, jobs, now=0.0))
    assert {a.config.num_nodes for a in plan.assignments} == {1}
    servers = Counter(a.config.parts[0][0] for a in plan.assignments)
    assert sorted(servers.values()) == [1, 2]


def test_skips_are_recorded() -> None:
    c = cluster([("V100", 2, 4)])
    # 'split' needs 4 GPUs; only 2 are free on each server, and a spread
    # placement has no throughput without a distributed curve.
    curve = ThroughputCurve(agg=(100.0, 95.0, 95.0, 90.0))
    est = JobEstimate(job_id=JobId("split"), by_type={V: curve})
    huge = flat_estimate("huge", {"V100": 100.0})
    s = Snapshot(
        now=0.0, cluster=c, jobs=(state("split", [4]), state("huge", [16])),
        estimates={JobId("split"): est, JobId("huge"): huge},
        held={ServerId("V100-0"): 2, ServerId("V100-1"): 2},
    )
    r = GavelPolicy().decide(s)
    assert r.plan.assignments == ()
    assert r.skipped == {"split": "unplaceable", "huge": "no_throughput"}
    assert r.plan.reasons.passes[0].formulation == "gavel-max-min-lp, unplaced=1 (split)"


# --- what Gavel sees and when it plans ----------------------------------------------


def test_blind_to_server_entities() -> None:
    # A server-entity curve that makes V100-0 ten times slower, and different
    # server attributes, change nothing: Gavel stops at the GPU type.
    base = cluster([("V100", 2, 4), ("K80", 1, 4)])
    jobs = [state("a", [1, 2, 4], wait_s=50.0), state("b", [2], wait_s=10.0), state("c", [4])]
    s1 = snap(base, jobs, now=100.0)
    slow = ThroughputCurve(agg=(10.0,) * 8, dist=(5.0,) * 15)
    ests = {
        jid: msgspec.structs.replace(e, by_server={ServerId("V100-0"): slow})
        for jid, e in s1.estimates.items()
    }
    servers = tuple(
        Server(s.id, s.gpu_type, s.gpus, model=f"m{i}", cpu="x", network="ib")
        for i, s in enumerate(base.servers)
    )
    s2 = msgspec.structs.replace(
        s1, cluster=msgspec.structs.replace(base, servers=servers), estimates=ests
    )
    policy = GavelPolicy()
    assert without_timing(policy.plan(s1)) == without_timing(policy.plan(s2))


def test_later_plan_in_a_round_only_profiles() -> None:
    c = cluster([("V100", 1, 4), ("K80", 1, 4)])
    jobs = [state("new", [1], phase="profiling", unprofiled=["V100", "K80"]), state("q", [2])]
    plan = make_policy("gavel").plan(snap(c, jobs, now=0.0, first_plan=False))  # layered
    assert plan.assignments == ()
    assert {(t.job_id, t.gpu_type) for t in plan.profiling} == {("new", V), ("new", K)}
    assert plan.reasons.policy == "gavel"
    first = make_policy("gavel").plan(snap(c, jobs, now=0.0))
    assert [a.job_id for a in first.assignments] == ["q"]
    assert len(first.profiling) == 2


def test_five_hundred_jobs_solve_to_optimality() -> None:
    types = ["A", "B", "C", "D", "E"]
    c = cluster([(t, 13, 8) for t in types])
    jobs = [
        state(f"j{i:03d}", [1 + i % 3, 2 + i % 7, 8], wait_s=float(i), submit=float(i % 50))
        for i in range(500)
    ]
    speeds = {
        str(j.id): {t: 50.0 + (17 * i + 31 * k) % 300 for k, t in enumerate(types)}
        for i, j in enumerate(jobs)
    }
    s = snap(c, jobs, speeds, now=1000.0)
    plan = GavelPolicy().plan(s)
    assert plan.reasons.passes[0].status == "Optimal"
    assert plan.reasons.passes[0].variables == 500 * 5 + 1
    assert len(plan.assignments) > 0


# --- invariants over random snapshots ---------------------------------------------

SIZES = [1, 2, 3, 4, 6, 8, 12, 16]


@st.composite
def scenes(draw: st.DrawFn) -> Snapshot:
    types = draw(st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=3, unique=True))
    layout = [
        (t, draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4, 8])))
        for t in types
        for _ in range(draw(st.integers(1, 2)))
    ]
    c = cluster(layout)
    held = {s.id: draw(st.integers(0, s.gpus // 2)) for s in c.servers}
    jobs: list[JobState] = []
    ests: dict[JobId, JobEstimate] = {}
    for i in range(draw(st.integers(1, 8))):
        jid = f"j{i}"
        reqs = draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=4, unique=True))
        if draw(st.integers(0, 5)) == 0:
            jobs.append(state(jid, reqs, phase="profiling", unprofiled=types[:1]))
            continue
        jobs.append(state(jid, reqs, wait_s=draw(st.floats(0, 3000)),
                          submit=draw(st.floats(0, 500))))
        runs_on = draw(st.lists(st.sampled_from(types), min_size=1, unique=True))
        ests[JobId(jid)] = flat_estimate(
            jid, {t: draw(st.floats(10, 500)) for t in runs_on},
            rho=draw(st.floats(1.0, 3.0)), max_gpus=16,
        )
    return Snapshot(now=1000.0, cluster=c, jobs=tuple(jobs), estimates=ests, held=held)


def check_plan(s: Snapshot, r: GavelRound) -> None:
    plan = r.plan
    ids = [a.job_id for a in plan.assignments]
    assert len(ids) == len(set(ids))
    use: Counter[str] = Counter()
    for a in plan.assignments:
        job = next(j for j in s.jobs if j.id == a.job_id)
        assert job.phase != "profiling"
        assert a.config.total_gpus == rigid_requirement(job.spec, 8)
        assert len({s.cluster.by_id[sid].gpu_type for sid in a.config.servers}) == 1
        assert a.throughput > 0
        for sid, g in a.config.parts:
            use[sid] += g
    for t in plan.profiling:
        use[t.server] += t.gpus
    for server in s.cluster.servers:
        assert use[server.id] + s.held.get(server.id, 0) <= server.gpus
    assert set(r.skipped).isdisjoint(ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_plans_are_feasible_and_deterministic_over_rounds(s: Snapshot) -> None:
    policy = GavelPolicy()
    for _ in range(3):
        r = policy.decide(s)
        check_plan(s, r)
        assert without_timing(GavelPolicy().plan(s)) == without_timing(r.plan)
        s = advance(s, r.plan)
