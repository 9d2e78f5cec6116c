"""Properties of the HiveD layer over random small multi-tenant workloads in
the simulator (HiveD §3.3 Theorem 1; the invariants of issue 20)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.cells import CellModel, Cells
from scheduling.check import plan_overallocation
from scheduling.layers.hived import decode_state
from scheduling.layers.quota import quotas_of
from shared.snapshot import Plan, Snapshot
from tests.helpers import untimed
from tests.hived_setup import RTX, job, model_of, record, rtx_cluster, simulate

LAYOUTS: dict[int, dict[str, list[tuple[str, int]]]] = {
    2: {"a": [("NODE", 1)], "b": [("QUAD", 1), ("PAIR", 1), ("RTX3090", 1)]},
    3: {"a": [("NODE", 1)], "b": [("QUAD", 2)], "c": [("PAIR", 2), ("RTX3090", 2)]},
}
SHAPES = [(1,), (2,), (1, 2), (4,), (2, 4), (8,), (4, 8)]


@st.composite
def workloads(draw: Any) -> tuple[int, bool, list[Any]]:
    tenants = draw(st.sampled_from([2, 3]))
    names = [*LAYOUTS[tenants], "lp", "zz"]  # a low-priority tenant, an unknown one
    jobs = []
    for i in range(draw(st.integers(2, 7))):
        jobs.append(job(f"j{i}", draw(st.sampled_from(names)), draw(st.sampled_from(SHAPES)),
                        at=60.0 * draw(st.integers(0, 15)),
                        samples=draw(st.sampled_from([200_000, 1_000_000, 3_000_000]))))
    return tenants, draw(st.booleans()), jobs


def gpus_of(cells: Cells, job_id: str) -> set[tuple[str, int]]:
    return {(p.server, i) for p in cells.allocation(job_id).placement for i in p.indices}


def check(model: CellModel, snap: Snapshot, plan: Plan) -> None:
    assert plan_overallocation(snap, plan) is None
    ids = [a.job_id for a in plan.assignments]
    assert len(ids) == len(set(ids))  # one configuration per job
    cells = Cells.restore(model, decode_state(record(plan, "hived").state).cells)
    assert cells.check_safety() == ()
    for a in plan.assignments:  # every assignment is the job's cells
        assert a.config.as_dict() == cells.allocation(a.job_id).servers()
    taken: set[tuple[str, int]] = set()
    for tenant in cells.tenants():
        view = cells.view(tenant)
        bound = {(s.server, i) for chain in view.chains for b in chain.bound
                 for s in b.servers for i in s.indices}
        for job_id in view.guaranteed_jobs:
            gpus = gpus_of(cells, job_id)
            assert gpus <= bound  # a guaranteed job lies in its tenant's cells
            assert not gpus & taken
            taken |= gpus
    for alloc in cells.allocations():
        if alloc.opportunistic:
            gpus = gpus_of(cells, alloc.job_id)
            assert not gpus & taken
            taken |= gpus


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_plan_keeps_the_invariants_and_is_deterministic(
        case: tuple[int, bool, list[Any]]) -> None:
    tenants, opportunistic, jobs = case
    cluster = rtx_cluster(tenants)
    model = model_of(cluster, LAYOUTS[tenants], low=("lp",), weights={"lp": 0.5})
    spec = f"hived:opportunistic={str(opportunistic).lower()},inner=hops:lam=inf"
    _, spy = simulate(cluster, jobs, spec, model, max_time_s=4 * 3600.0)
    unknown = {j.spec.id for j in jobs if j.spec.tenant == "zz"}
    for snap, plan in spy.calls:
        check(model, snap, plan)
        assert unknown.isdisjoint(a.job_id for a in plan.assignments)
        assert unknown & {j.id for j in snap.jobs} <= set(record(plan, "hived").held_back)
    _, again = simulate(cluster, jobs, spec, model, max_time_s=4 * 3600.0)
    assert [untimed(p) for _, p in again.calls] == [untimed(p) for _, p in spy.calls]
    assert [s for s, _ in again.calls] == [s for s, _ in spy.calls]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_quota_never_takes_a_tenant_beyond_its_quota(case: tuple[int, bool, list[Any]]) -> None:
    """At every plan of ``quota`` each tenant's GPUs (running jobs that keep
    theirs, and the plan's) are within its reserved GPUs."""
    tenants, _, jobs = case
    cluster = rtx_cluster(tenants)
    model = model_of(cluster, LAYOUTS[tenants], low=("lp",), weights={"lp": 0.5})
    quotas = quotas_of(model)
    _, spy = simulate(cluster, jobs, "quota:inner=hops:lam=inf", model, max_time_s=4 * 3600.0)
    for snap, plan in spy.calls:
        assert plan_overallocation(snap, plan) is None
        tenant = {j.id: j.spec.tenant for j in snap.jobs}
        use: Counter[str] = Counter()
        if not snap.first_plan:
            for j in snap.jobs:
                if j.phase == "running" and j.current is not None:
                    use[j.spec.tenant] += j.current.total_gpus
        for a in plan.assignments:
            use[tenant[a.job_id]] += a.config.total_gpus
        for t, gpus in use.items():
            assert gpus <= quotas.get(t, {}).get(RTX, 0)
