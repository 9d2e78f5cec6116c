"""Reasons and preemption receipts (scheduling/explain): one worked example
per reason code, one receipt per stop rule, and the property that every
job a plan of a random simulation does not run has exactly one reason."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.common.simrun import RunSpec, simulate, write_outputs
from scheduling.explain import (
    explain,
    held_why,
    receipts,
    running_after,
    unschedulable_why,
    with_reasons,
)
from scheduling.layers.base import stack
from scheduling.policies.hops.policy import HopsPolicy
from scheduling.registry import make_policy
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.explain import REASON_CODES, Why, render
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import Assignment, JobState, Plan, PlanReasons, ProfilingTask, Snapshot
from simulator.engine import Simulation
from simulator.metrics import RUNNING
from simulator.settings import SimSettings
from tests.helpers import cluster, flat_estimate, state
from tests.hived_setup import Spy, model_of, record, rtx_cluster
from tests.hived_setup import job as tenant_job
from tests.hived_setup import simulate as tenant_simulate
from tests.test_coda_layer import cluster as core_cluster
from tests.test_coda_layer import cpu_job
from tests.test_coda_layer import snap as core_snap
from world.catalog import builtin_catalog
from world.truth import GroundTruth

A = GpuType("A")


def snapshot(c: Cluster, jobs: Sequence[JobState], *, held: dict[str, int] | None = None,
             first: bool = True, rho: float = 1.0) -> Snapshot:
    ests = {j.id: flat_estimate(j.id, {"A": 100.0}, rho=rho) for j in jobs
            if j.phase != "profiling"}
    return Snapshot(now=100.0, cluster=c, jobs=tuple(jobs), estimates=ests, first_plan=first,
                    held={ServerId(k): v for k, v in (held or {}).items()})


def running(job_id: str, reqs: Sequence[int], parts: dict[str, int],
            done: float = 500.0) -> JobState:
    return msgspec.structs.replace(state(job_id, reqs), phase="running",
                                   current=Configuration.of(parts), done_samples=done)


def plan_of(*assigned: tuple[str, dict[str, int]], prio: dict[str, float] | None = None,
            window: Sequence[str] = (), profiling: Sequence[ProfilingTask] = ()) -> Plan:
    reasons = PlanReasons(policy="hops",
                          priorities={JobId(k): v for k, v in (prio or {}).items()},
                          latency_ratios={JobId(k): v / 10 for k, v in (prio or {}).items()},
                          window=tuple(JobId(j) for j in window))
    return Plan(tuple(Assignment(JobId(j), Configuration.of(p)) for j, p in assigned),
                tuple(profiling), reasons)


def why_of(snap: Snapshot, plan: Plan, job_id: str, **kw: object) -> Why:
    whys = explain(snap, plan, **kw)  # type: ignore[arg-type]
    assert set(whys) == {j.id for j in snap.jobs} - running_after(snap, plan)
    return whys[JobId(job_id)]


# ---------------------------------------------------------------- reasons


def test_profiling_names_the_types_that_remain() -> None:
    snap = snapshot(cluster([("A", 1, 4)]), [state("p", [1], phase="profiling",
                                                   unprofiled=["A"])])
    why = why_of(snap, HopsPolicy().plan(snap), "p")
    assert why.code == "Profiling" and why.types == (A,)


def test_a_job_a_later_plan_did_not_rank_waits_for_the_next_plan() -> None:
    snap = snapshot(cluster([("A", 1, 4)]), [running("r", [2], {"A-0": 2}), state("new", [2])],
                    held={"A-0": 2}, first=False)
    why = why_of(snap, plan_of(), "new", next_plan_at=360.0)
    assert why.code == "WaitingForPlan" and why.next_plan_at == 360.0
    ranked = msgspec.structs.replace(plan_of(prio={"new": 1.0}))
    assert why_of(snap, ranked, "new").code != "WaitingForPlan"


def test_resources_says_which_type_is_short_and_by_how_much() -> None:
    snap = snapshot(cluster([("A", 1, 4)]), [state("big", [8])])
    why = why_of(snap, HopsPolicy().plan(snap), "big")
    assert (why.code, why.gpu_type, why.short) == ("Resources", "A", 4)
    assert "big" not in why.message


def test_fragmentation_when_enough_is_free_in_no_accepted_shape() -> None:
    # Two free GPUs on each of two servers; a job that may not spread
    # (rho above sigma) needs 4 on one server.
    snap = snapshot(cluster([("A", 2, 4)]), [state("f", [4])],
                    held={"A-0": 2, "A-1": 2}, rho=10.0)
    why = why_of(snap, HopsPolicy().plan(snap), "f")
    assert (why.code, why.free) == ("Fragmentation", 4)
    tolerant = snapshot(cluster([("A", 2, 4)]), [state("f", [4])],
                        held={"A-0": 2, "A-1": 2}, rho=1.0)
    assert why_of(tolerant, plan_of(), "f").code == "Priority"  # it could spread


def test_node_drained_when_only_a_drained_node_could_take_it() -> None:
    snap = snapshot(cluster([("A", 2, 4)]), [state("d", [4])], held={"A-0": 4, "A-1": 4})
    assert why_of(snap, plan_of(), "d", drained=[ServerId("A-1")]).code == "NodeDrained"
    assert why_of(snap, plan_of(), "d").code == "Resources"


def test_outside_window_gives_the_rank_and_the_window() -> None:
    snap = snapshot(cluster([("A", 1, 8)]), [state("a", [4]), state("b", [2]), state("c", [2])])
    plan = plan_of(("a", {"A-0": 4}), prio={"a": 3.0, "b": 2.0, "c": 1.0}, window=["a", "b"])
    why = why_of(snap, plan, "c")
    assert (why.code, why.rank, why.window) == ("OutsideWindow", 3, 2)


def test_the_real_window_leaves_out_what_cannot_fit_beside_the_first() -> None:
    # a has waited long: its latency ratio ranks it first; the window of
    # one 4-GPU server holds one 4-GPU job.
    snap = snapshot(cluster([("A", 1, 4)]), [state("a", [4], wait_s=50_000.0),
                                             state("b", [4], submit=10.0)])
    plan = HopsPolicy().plan(snap)
    assert plan.config_of(JobId("a")) is not None and plan.reasons.window == (JobId("a"),)
    why = why_of(snap, plan, "b")
    assert (why.code, why.rank, why.window) == ("OutsideWindow", 2, 1)


def test_priority_names_the_higher_priority_jobs_and_their_ratios() -> None:
    # In the window, but a, c and d took every GPU of the only server.
    snap = snapshot(cluster([("A", 1, 8)]), [state(j, [2]) for j in "abcde"])
    plan = plan_of(("a", {"A-0": 2}), ("c", {"A-0": 2}), ("d", {"A-0": 2}), ("e", {"A-0": 2}),
                   prio={"a": 5.0, "b": 4.5, "c": 4.0, "d": 6.0, "e": 1.0},
                   window=["a", "b", "c", "d", "e"])
    why = why_of(snap, plan, "b")
    assert why.code == "Priority" and why.jobs == (JobId("d"), JobId("a"))
    assert why.ratios == (0.6, 0.5)
    assert render(why, lambda j: False).endswith("another tenant's job")
    # With room left after the plan no one is named.
    roomy = snapshot(cluster([("A", 1, 8)]), [state("a", [4]), state("b", [4])])
    why = why_of(roomy, plan_of(("a", {"A-0": 4}), prio={"a": 2.0, "b": 1.0}), "b")
    assert why.code == "Priority" and why.jobs == ()


def test_unschedulable_when_no_server_has_a_type_it_runs_on() -> None:
    snap = snapshot(cluster([("A", 1, 4)]), [state("u", [1])])
    snap = msgspec.structs.replace(snap, estimates={JobId("u"): flat_estimate("u", {"B": 1.0})})
    assert why_of(snap, plan_of(), "u").code == "Unschedulable"
    assert unschedulable_why("no node has B").code == "Unschedulable"


def test_no_estimate_rather_than_priority_for_a_job_no_plan_can_place() -> None:
    # A live job the estimators gave no estimate (issue 36: after down and
    # up): it would fit the idle cluster, but no policy places it.
    snap = snapshot(cluster([("A", 1, 4)]), [state("e", [1])])
    unestimated = msgspec.structs.replace(snap, estimates={})
    plan = HopsPolicy().plan(unestimated)
    assert plan.assignments == ()
    why = why_of(unestimated, plan, "e")
    assert why.code == "NoEstimate" and "no throughput estimate" in why.message
    assert why_of(unestimated, plan_of(), "e", next_plan_at=1.0).code == "NoEstimate"
    assert HopsPolicy().plan(snap).config_of(JobId("e")) is not None  # with one it runs


def test_held_is_a_record_level_reason() -> None:
    assert held_why("until Monday") == Why(code="Held", message="held by a user: until Monday")


def test_quota_through_the_real_quota_layer() -> None:
    c = rtx_cluster(2)
    model = model_of(c, {"a": [("QUAD", 1)], "b": [("NODE", 1)]})
    job = tenant_job("big", "a", [8])
    snap = Snapshot(now=0.0, cluster=c, jobs=(JobState(spec=job.spec),),
                    estimates={JobId("big"): flat_estimate("big", {"RTX3090": 100.0})})
    plan = make_policy("quota", cells=model).plan(snap)
    why = why_of(snap, plan, "big")
    assert (why.code, why.layer, why.gpu_type, why.short) == ("Quota", "quota", "RTX3090", 4)
    assert "may use 4" in why.message


def test_tenant_cells_through_the_real_hived_layer() -> None:
    # a's one node: its first job takes it, its second finds no free cell.
    c = rtx_cluster(1)
    model = model_of(c, {"a": [("NODE", 1)]})
    jobs = tuple(JobState(spec=tenant_job(j, "a", [8], at=float(i)).spec)
                 for i, j in enumerate(["a1", "a2"]))
    snap = Snapshot(now=10.0, cluster=c, jobs=jobs,
                    estimates={j.id: flat_estimate(j.id, {"RTX3090": 100.0}) for j in jobs})
    plan = make_policy("hived", cells=model).plan(snap)
    (waiting,) = [j for j in jobs if plan.config_of(j.id) is None]
    why = why_of(snap, plan, waiting.id)
    assert (why.code, why.layer, why.short) == ("TenantCells", "hived", 8)


def test_cores_through_the_real_core_layer() -> None:
    c = core_cluster(cores=16)
    snap = core_snap(c, [cpu_job("huge", 20)])
    plan = make_policy("coda:reserve_per_gpu=2").plan(snap)
    why = why_of(snap, plan, "huge")
    assert why.code == "Cores" and why.layer == "coda" and why.short == 20 - 16


def test_with_reasons_changes_nothing_but_the_reasons() -> None:
    snap = snapshot(cluster([("A", 1, 4)]), [state("a", [4], wait_s=9e4), state("b", [4])])
    plan = HopsPolicy().plan(snap)
    out = with_reasons(snap, plan)
    assert msgspec.structs.replace(out.reasons, why={}) == plan.reasons
    assert out.assignments == plan.assignments and set(out.reasons.why) == {JobId("b")}


# --------------------------------------------------------------- receipts


def test_receipt_fairness_names_the_taker_and_the_progress_kept() -> None:
    snap = snapshot(cluster([("A", 1, 4)]), [running("r", [4], {"A-0": 4}, done=700.0),
                                             state("waiter", [4], wait_s=9e4)])
    plan = plan_of(("waiter", {"A-0": 4}), prio={"waiter": 2.0, "r": 1.0})
    (rec,) = receipts(snap, plan, round_no=7)
    assert (rec.rule, rec.takers, rec.samples_kept, rec.round) == \
        ("Fairness", ("waiter",), 700.0, 7)
    assert rec.total_samples == 1_000_000 and "waiter" not in rec.message
    later = msgspec.structs.replace(snap, first_plan=False)
    assert receipts(later, plan_of()) == ()


def test_receipt_drain_and_node_lost() -> None:
    snap = snapshot(cluster([("A", 2, 4)]), [running("r", [4], {"A-1": 4})])
    (rec,) = receipts(snap, plan_of(), drained=[ServerId("A-1")])
    assert rec.rule == "Drain"
    (rec,) = receipts(snap, plan_of(), lost=[ServerId("A-1")])
    assert rec.rule == "NodeLost"


def test_receipt_profiling_and_resize() -> None:
    snap = snapshot(cluster([("A", 1, 4)]), [running("r", [2, 4], {"A-0": 4})])
    task = ProfilingTask(JobId("p"), A, ServerId("A-0"))
    (rec,) = receipts(snap, plan_of(profiling=[task]))
    assert rec.rule == "Profiling"
    (rec,) = receipts(snap, plan_of(("r", {"A-0": 2})))
    assert rec.rule == "Resize"
    assert receipts(snap, plan_of(("r", {"A-0": 4}))) == ()  # kept: no receipt


def test_receipt_cell_reclaim_through_the_real_hived_layer() -> None:
    """b's opportunistic jobs fill a's idle node; a's 8-GPU job reclaims it
    at the next first plan (HiveD §3.3)."""
    c = rtx_cluster(2)
    model = model_of(c, {"a": [("NODE", 1)], "b": [("NODE", 1)]})
    jobs = [tenant_job(f"b{i}", "b", [1], at=0.0, samples=8_000_000) for i in range(15)]
    jobs.append(tenant_job("a0", "a", [8], at=400.0))
    _, spy = tenant_simulate(c, jobs, "hived", model, max_time_s=3600.0)
    snap, plan = next((s, p) for s, p in spy.calls
                      if s.first_plan and "preempted" in record(p, "hived").note)
    config = plan.config_of(JobId("a0"))
    assert config is not None
    victims = {j.id for j in snap.jobs if j.current is not None
               and set(j.current.servers) & set(config.servers)}
    reclaimed = [r for r in receipts(snap, plan) if r.rule == "CellReclaim"]
    assert victims and {r.job_id for r in reclaimed} == victims
    assert all(r.takers == (JobId("a0"),) and r.samples_kept > 0 for r in reclaimed)
    why = explain(snap, plan)
    assert all(why[r.job_id].code == "TenantCells" for r in reclaimed
               if r.job_id in why)


# --------------------------------------------------------------- property

POLICIES = ("hops", "sia", "gavel", "hived", "quota-borrow")


def workload(sizes: Sequence[tuple[int, float, int]]) -> list[object]:
    return [tenant_job(f"j{i}", "ab"[t], [g], at=at, samples=20_000_000)
            for i, (g, at, t) in enumerate(sizes)]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(sizes=st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.floats(0, 1800),
                                st.integers(0, 1)), min_size=2, max_size=10),
       policy=st.sampled_from(POLICIES))
def test_every_job_a_plan_does_not_run_has_exactly_one_reason(
        sizes: list[tuple[int, float, int]], policy: str) -> None:
    c = rtx_cluster(2)
    model = model_of(c, {"a": [("NODE", 1)], "b": [("QUAD", 2)]})
    spy = Spy()
    sim = Simulation(c, workload(sizes), stack(make_policy(policy, cells=model), spy),  # type: ignore[arg-type]
                     GroundTruth(c, builtin_catalog()), SimSettings(max_time_s=4 * 3600.0))
    result = sim.run()
    assert spy.calls
    for snap, plan in spy.calls:
        why = with_reasons(snap, plan).reasons.why
        waiting = {j.id for j in snap.jobs} - running_after(snap, plan)
        assert set(why) == waiting
        assert all(w.code in REASON_CODES for w in why.values())
    codes = {code for history in result.reasons.values() for _, code in history}
    assert codes <= {*REASON_CODES, RUNNING} and RUNNING in codes
    for history in result.reasons.values():  # one entry per change
        assert all(a[1] != b[1] for a, b in itertools.pairwise(history))


def test_the_results_carry_each_jobs_reason_history(tmp_path: Path) -> None:
    spec = RunSpec(cluster="paper-physical", workload="paper-physical", first_n=3)
    cluster, result = simulate(spec)
    summary = write_outputs(tmp_path, spec, cluster, result)
    written = json.loads((tmp_path / "reasons.json").read_text())
    assert set(written) == {j.id for j in result.jobs} and "reasons" not in summary
    for history in written.values():
        assert history[0][1] in REASON_CODES and history[-1][1] == RUNNING
        assert [t for t, _ in history] == sorted(t for t, _ in history)
