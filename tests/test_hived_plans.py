"""One plan of the tenant layers on a hand-built snapshot (weighted max-min
of opportunistic GPUs, unknown tenants, profiling holds), the registry's
tenant specs, and quota with and without borrowing in the simulator."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from scheduling.cells import Refusal
from scheduling.layers.base import LayeredPolicy, annotate, stack
from scheduling.layers.hived import HivedLayer, restore_cells
from scheduling.layers.profiling_first import ProfilingFirst
from scheduling.layers.quota import QuotaLayer, quotas_of
from scheduling.policy import Policy
from scheduling.registry import (
    HivedSpec,
    PolicyError,
    QuotaBorrowSpec,
    make_policy,
    parse_policy,
    spec_text,
)
from shared.configuration import Configuration
from shared.ids import JobId, ServerId, TenantId
from shared.snapshot import Assignment, JobState, LayerRecord, Plan, Snapshot
from simulator.engine import Simulation
from tests.helpers import flat_estimate, state
from tests.hived_setup import RTX, config_of, job, model_of, record, rtx_cluster, simulate
from world.catalog import builtin_catalog
from world.truth import GroundTruth


def tenant_job(job_id: str, tenant: str, gpus: list[int], **kw: object) -> JobState:
    base = state(job_id, gpus, **kw)  # type: ignore[arg-type]
    return msgspec.structs.replace(
        base, spec=msgspec.structs.replace(base.spec, tenant=TenantId(tenant)))


def snapshot(jobs: list[JobState], nodes: int = 1, **kw: object) -> Snapshot:
    ests = {j.id: flat_estimate(j.id, {str(RTX): 100.0}) for j in jobs}
    return Snapshot(now=0.0, cluster=rtx_cluster(nodes), jobs=tuple(jobs), estimates=ests,
                    **kw)  # type: ignore[arg-type]


def per_tenant(plan_jobs: list[JobState], assigned: set[JobId]) -> Counter[str]:
    return Counter(j.spec.tenant for j in plan_jobs if j.id in assigned)


def test_idle_gpus_go_to_tenants_by_weighted_max_min() -> None:
    """An owner's idle node, and two low-priority tenants of weights 1 and 3
    with eight 1-GPU jobs each: 2 and 6 GPUs (§3.3)."""
    cluster = rtx_cluster(1)
    model = model_of(cluster, {"owner": [("NODE", 1)]}, low=("x", "y"),
                     weights={"x": 1.0, "y": 3.0})
    jobs = [tenant_job(f"{t}{i}", t, [1]) for i in range(8) for t in ("x", "y")]
    plan = make_policy("hived:inner=hops:lam=inf", cells=model).plan(snapshot(jobs))
    assert per_tenant(jobs, {a.job_id for a in plan.assignments}) == {"x": 2, "y": 6}
    off = make_policy("hived:opportunistic=false,inner=hops:lam=inf", cells=model)
    plan = off.plan(snapshot(jobs))
    assert plan.assignments == () and set(record(plan, "hived").held_back) == {
        j.id for j in jobs}


def test_an_unknown_tenants_job_is_held_back_with_a_reason() -> None:
    cluster = rtx_cluster(1)
    model = model_of(cluster, {"owner": [("NODE", 1)]})
    jobs = [tenant_job("mine", "owner", [4]), tenant_job("stray", "nobody", [1])]
    plan = make_policy("hived:inner=hops:lam=inf", cells=model).plan(snapshot(jobs))
    assert [a.job_id for a in plan.assignments] == ["mine"]
    rec = record(plan, "hived")
    assert rec.held_back == ("stray",) and "stray: unknown tenant nobody" in rec.note


def test_profiling_runs_are_held_physically_not_in_the_view() -> None:
    """Six GPUs of the only node run profiling: the tenant's VC still shows
    its node, and the layer places only what the two free GPUs hold."""
    cluster = rtx_cluster(1)
    model = model_of(cluster, {"owner": [("NODE", 1)]})
    jobs = [tenant_job("one", "owner", [1]), tenant_job("two", "owner", [2]),
            tenant_job("four", "owner", [4])]
    snap = snapshot(jobs, held={ServerId("n0"): 6}, profiling_held={ServerId("n0"): 6})
    plan = make_policy("hived:inner=hops:lam=inf", cells=model).plan(snap)
    assert sum(a.config.total_gpus for a in plan.assignments) <= 2
    assert plan.assignments  # something fits in the two free GPUs


def test_the_registry_builds_tenant_policies_with_one_profiling_layer() -> None:
    cluster = rtx_cluster(2)
    model = model_of(cluster, {"a": [("NODE", 1)], "b": [("NODE", 1)]})
    with pytest.raises(PolicyError, match="policy hived needs the tenants' cells"):
        make_policy("hived")
    with pytest.raises(PolicyError, match="policy quota-borrow needs the tenants' cells"):
        make_policy("quota-borrow")
    with pytest.raises(PolicyError, match="tenant policy"):
        parse_policy("hived:inner=quota")
    spec = parse_policy("hived:opportunistic=false,inner=hops:lam=inf,sigma=1.6")
    assert spec == HivedSpec(inner="hops:lam=inf,sigma=1.6", opportunistic=False)
    assert parse_policy(spec_text(spec)) == spec and spec.r_num == 8
    policy = make_policy(spec, cells=model)
    assert isinstance(policy, LayeredPolicy) and policy.name == "hops"
    # Layers innermost first: profiling inside each virtual cluster, under HiveD.
    profiling, hived = policy.layers
    assert isinstance(hived, HivedLayer) and isinstance(profiling, ProfilingFirst)
    assert not hived.opportunistic and hived.profiling == profiling.settings
    borrow = make_policy(QuotaBorrowSpec(inner="sia"), cells=model)
    assert isinstance(borrow, LayeredPolicy) and borrow.name == "sia"
    quota, outer = borrow.layers  # quota admits; profiling stays cluster-wide
    assert isinstance(quota, QuotaLayer) and quota.borrow
    assert isinstance(outer, ProfilingFirst)
    assert quotas_of(model) == {"a": {RTX: 8}, "b": {RTX: 8}}


def test_quota_never_exceeds_and_quota_borrow_lends_then_reclaims() -> None:
    """b's fifteen 1-GPU jobs: ``quota`` runs at most 8 (b's quota) at once;
    ``quota-borrow`` runs them on a's idle node too, and a's 8-GPU job, once
    profiled, takes its GPUs back at the next first plan."""
    cluster = rtx_cluster(2)
    model = model_of(cluster, {"a": [("NODE", 1)], "b": [("NODE", 1)]})
    jobs = [job(f"b{i}", "b", [1], samples=8_000_000) for i in range(15)]
    jobs.append(job("a0", "a", [8], at=400.0))

    def b_running(snap: Snapshot) -> int:
        return sum(1 for j in snap.jobs if j.spec.tenant == "b" and j.phase == "running")

    _, spy = simulate(cluster, jobs, "quota:inner=hops:lam=inf", model)
    assert max(b_running(s) for s, _ in spy.calls) <= 8
    _, spy = simulate(cluster, jobs, "quota-borrow:inner=hops:lam=inf", model)
    assert max(b_running(s) for s, _ in spy.calls) > 8
    found = config_of(spy, "a0")
    assert found is not None
    snap, config = found
    assert snap.first_plan and config.num_nodes == 1
    plan = next(p for s, p in spy.calls if s is snap)
    assert sum(1 for a in plan.assignments if a.job_id.startswith("b")) <= 8


class Counting:
    """A stateful layer: counts its plans in its state."""

    name = "counting"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        count = int(snapshot.layer_state.get(self.name, b"0"))
        self.seen.append(count)
        return annotate(inner.plan(snapshot), LayerRecord(self.name, state=b"%d" % (count + 1)))


def test_the_simulator_threads_each_layers_state_to_the_next_plan() -> None:
    cluster = rtx_cluster(1)
    layer = Counting()
    jobs = [job(f"j{i}", "default", [1], at=100.0 * i) for i in range(3)]
    Simulation(cluster, jobs, stack(make_policy("hops:lam=inf"), layer),
               GroundTruth(cluster, builtin_catalog())).run()
    assert len(layer.seen) > 3 and layer.seen == list(range(len(layer.seen)))


def test_a_server_missing_from_the_snapshot_becomes_a_doomed_cell() -> None:
    """n1 is gone from the cluster (§4 "Handling faulty hardware"): the
    layer marks it bad, the tenant left with it sees a doomed cell (its
    view holds those GPUs) and nothing is placed there."""
    model = model_of(rtx_cluster(2), {"a": [("NODE", 1)], "b": [("NODE", 1)]})
    jobs = [tenant_job("a0", "a", [8]), tenant_job("b0", "b", [8])]
    plan = make_policy("hived:inner=hops:lam=inf", cells=model).plan(snapshot(jobs, nodes=1))
    cells = restore_cells(model, record(plan, "hived").state)
    assert cells.bad_servers == {"n1"}
    doomed = [t for t in ("a", "b") if any(c.doomed for c in cells.view(t).chains[0].bound)]
    assert len(doomed) == 1 and cells.view(doomed[0]).chains[0].bad_gpus == 8
    (placed,) = plan.assignments  # the other tenant's job, on the healthy node
    assert placed.job_id != f"{doomed[0]}0" and placed.config.parts == (("n0", 8),)


class Scripted:
    """An inner policy that plans the virtual configurations it is given:
    the layer's contract is to bind whatever its inner policy plans on the
    VC view, so the test names the plans instead of searching for them."""

    name = "scripted"

    def __init__(self, configs: dict[str, dict[str, int]]) -> None:
        self.configs = configs

    def plan(self, snapshot: Snapshot) -> Plan:
        return Plan(tuple(Assignment(j.id, Configuration.of(
            {ServerId(s): g for s, g in self.configs[j.id].items()}))
            for j in snapshot.jobs if j.id in self.configs))


def test_whatever_the_view_allows_is_bound_one_to_one() -> None:
    """Each virtual server stands for one virtual cell, bound to one
    physical node: two 6-GPU jobs on a's two virtual nodes leave 2 GPUs on
    each, and a 4-GPU job the inner policy splits 2 + 2 over them runs on
    exactly those two physical nodes. Binding it by its GPU count alone (a
    4-GPU cell) finds no such cell, which is how jobs waited longer than in
    their private cluster (the sharing anomaly the layer exists to remove)."""
    cluster = rtx_cluster(3)
    model = model_of(cluster, {"a": [("NODE", 2)], "b": [("NODE", 1)]})
    script = {"r0": {"a/RTX3090/0": 6}, "r1": {"a/RTX3090/1": 6},
              "j": {"a/RTX3090/0": 2, "a/RTX3090/1": 2}, "b0": {"b/RTX3090/0": 8}}
    policy = stack(Scripted(script), HivedLayer(model, opportunistic=False))
    jobs = [tenant_job(j, t, [g]) for j, t, g in (("r0", "a", 6), ("r1", "a", 6), ("b0", "b", 8))]
    first = policy.plan(snapshot(jobs, nodes=3))
    where = {a.job_id: a.config for a in first.assignments}
    assert set(where) == {"r0", "r1", "b0"}
    assert len({s for c in where.values() for s, _ in c.parts}) == 3  # one node each
    running = [msgspec.structs.replace(j, phase="running", current=where[j.id]) for j in jobs]
    later = snapshot([*running, tenant_job("j", "a", [4])], nodes=3, first_plan=False,
                     held={s: g for c in where.values() for s, g in c.parts},
                     layer_state={"hived": record(first, "hived").state})
    plan = policy.plan(later)
    (placed,) = plan.assignments
    assert placed.job_id == "j" and placed.config.as_dict() == {
        where[JobId("r0")].servers[0]: 2, where[JobId("r1")].servers[0]: 2}
    cells = restore_cells(model, record(first, "hived").state)
    refused = cells.allocate("a", RTX, 4, "j")  # by GPU count: no free 4-GPU cell of a's
    assert isinstance(refused, Refusal) and refused.reason == "no-cell"
