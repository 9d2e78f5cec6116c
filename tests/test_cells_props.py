"""Properties of buddy cell allocation (HiveD §3.3, Algorithm 1, Theorem 1)
over random feasible cell trees and reservations, with allocations,
opportunistic jobs and releases interleaved."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.cells import Allocation, Cells, Refusal, VirtualSlot, cells_from_doc, virtual_slots
from scheduling.cells.buddy import FREE, POOL
from scheduling.cells.spec import Chain, shortfall
from shared.ids import GpuType
from tests.cells_trees import cluster

GPU = GpuType("G")


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, tuple[str, int]]]:
    """A chain of 2-4 levels with split factors 2-3, a node level, 1-4 top
    cells (some below the top level) and 1-3 tenants with feasible cells."""
    splits = draw(st.lists(st.integers(2, 3), min_size=1, max_size=3))
    top = len(splits) + 1
    node = draw(st.integers(1, top))
    names = ["G"] + [f"L{lv}" for lv in range(2, top + 1)]
    types = {names[lv - 1]: {"child_cell_type": names[lv - 2],
                             "child_cell_number": splits[lv - 2],
                             "is_node_level": lv == node} for lv in range(2, top + 1)}
    if node == 1:  # one GPU per server: the leaf is the node; add a node-level wrapper
        types = {k: v | {"is_node_level": False} for k, v in types.items()}
        return draw(worlds())
    sizes = [1]
    for s in splits:
        sizes.append(sizes[-1] * s)
    servers: dict[str, tuple[str, int]] = {}

    def cell(level: int) -> dict[str, Any]:
        if level == node:
            sid = f"s{len(servers)}"
            servers[sid] = ("G", sizes[node - 1])
            return {"cell_type": names[level - 1], "server": sid}
        kids = [cell(level - 1) for _ in range(splits[level - 2])]
        return {"cell_type": names[level - 1], "children": kids}

    top_levels = draw(st.lists(st.integers(node, top), min_size=1, max_size=4))
    physical = [cell(lv) for lv in sorted(top_levels, reverse=True)]
    chain = Chain(GPU, tuple(names), tuple(sizes), node)
    free = [top_levels.count(lv) for lv in range(1, top + 1)]
    need = [0] * top
    vcs: dict[str, Any] = {}
    for t in range(draw(st.integers(1, 3))):
        cells = []
        for _ in range(draw(st.integers(0, 4))):
            lv, n = draw(st.integers(1, top)), draw(st.integers(1, 2))
            need[lv - 1] += n
            if shortfall(chain, free, need) is None:
                cells.append({"cell_type": names[lv - 1], "cell_number": n})
            else:
                need[lv - 1] -= n
        vcs[f"t{t}"] = {"virtual_cells": cells}
    return {"cell_types": types, "physical_cells": physical, "virtual_clusters": vcs}, servers


def build(doc: dict[str, Any], servers: dict[str, tuple[str, int]]) -> Cells:
    return Cells(cells_from_doc(doc, cluster(servers), "world.yaml"))


def state(cells: Cells) -> Any:
    return cells.snapshot(), cells.buddy.free_cells()


def legal(cells: Cells, tenant: str, gpus: int) -> bool:
    """Theorem 1's legality, read from the tenant's view and free cells: a
    free part of a bound cell, or an unbound virtual cell, at the job's
    level or above."""
    chain = cells.model.chains[GPU]
    level = chain.level_for(gpus)
    assert level is not None
    views = cells.view(tenant).chains
    unbound = any(lc.level >= level and lc.bound < lc.reserved for v in views for lc in v.levels)
    owned = any(owner == tenant and lv >= level
                and any(not cells.buddy.bad[d] for d in cells.tree.below(c, level))
                for _, lv, owner, c in cells.buddy.free_cells())
    return unbound or owned


def check_invariants(cells: Cells) -> None:
    tree, buddy = cells.tree, cells.buddy
    assert cells.check_safety() == ()
    # GPUs are conserved: every GPU is in exactly one free or held cell.
    held = [c for job in cells.jobs.values() if not job.opportunistic for c in job.cells]
    free = [c for *_, c in buddy.free_cells()]
    leaves = sorted(leaf for c in held + free for leaf in tree.leaves[c])
    assert leaves == sorted(c for c in range(len(tree)) if tree.level[c] == 1)
    # Each physical cell is bound at most once, at its virtual cell's level and chain.
    bound = cells.bindings.bound
    for c in bound:
        assert not any(a in bound for a in tree.ancestors(c)[1:])
    for t in cells.tenants():
        for view in cells.view(t).chains:
            for lc in view.levels:
                mine = [c for c, o in bound.items() if o == t and tree.level[c] == lc.level
                        and tree.chain[c] == view.gpu_type]
                assert len(mine) == lc.bound <= lc.reserved
    # Each bound cell is one virtual cell of its tenant, named once.
    b = cells.bindings
    assert sorted(b.slot) == sorted(bound)
    assert {v: k for k, v in b.by_slot.items()} == {
        c: (t, tree.chain[c], tree.level[c], b.slot[c]) for c, t in bound.items()}
    for c, t in bound.items():
        assert 0 <= b.slot[c] < b.reserved[t][tree.chain[c]][tree.level[c] - 1]
    # No free buddies left unmerged.
    for p in range(len(tree)):
        kids = tree.children[p]
        if kids and all(buddy.state[k] == FREE for k in kids):
            assert len({buddy.owner[k] for k in kids}) > 1 or any(k in bound for k in kids)
    # Guaranteed GPUs lie in their tenant's bound cells; no GPU has two jobs.
    used: dict[int, str] = {}
    for job_id, job in cells.jobs.items():
        for leaf in job.leaves:
            assert leaf not in used
            used[leaf] = job_id
        if not job.opportunistic:
            for c in job.cells:
                assert any(bound.get(a) == job.tenant for a in tree.ancestors(c))
    for c in free:
        if buddy.owner[c] != POOL:
            assert any(bound.get(a) == buddy.owner[c] for a in tree.ancestors(c))


Op = tuple[str, int, int, bool]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, tuple[str, int]], list[Op]]:
    doc, servers = draw(worlds())
    top = sum(s for _, s in servers.values())
    kinds = ["alloc", "alloc", "slot", "slot", "opp", "free", "health"]
    ops = draw(st.lists(st.tuples(st.sampled_from(kinds),
                                  st.integers(0, 2), st.integers(1, max(1, top)),
                                  st.booleans()), max_size=40))
    return doc, servers, ops


def run(cells: Cells, ops: list[Op], check: bool, prefix: str = "j") -> list[Any]:
    """Apply ``ops``; with ``check``, assert the properties after each
    (with servers dying and coming back: Theorem 1 and legality count the
    doomed cells, §4)."""
    decisions: list[Any] = []
    tenants = cells.tenants()
    for i, (kind, who, gpus, two) in enumerate(ops):
        tenant = tenants[who % len(tenants)]
        if kind == "health":  # a server dies or comes back
            server = sorted(cells.tree.node_of)[gpus % len(cells.tree.node_of)]
            cells.set_health(server, server in cells.bad_servers)
            decisions.append(sorted(cells.bad_servers))
        elif kind == "free":
            live = sorted(cells.jobs)
            if live:
                decisions.append(cells.release(live[gpus % len(live)]))
        elif kind == "slot":
            decisions.append(step_slots(cells, tenant, gpus, two, f"{prefix}{i}", check))
        else:
            decisions.append(step(cells, tenant, gpus, f"{prefix}{i}", kind == "opp", check))
        if check:
            check_invariants(cells)
    return decisions


def step(cells: Cells, tenant: str, gpus: int, job: str, opp: bool, check: bool) -> Any:
    before = state(cells)
    fits = cells.model.chains[GPU].level_for(gpus) is not None
    was_legal = not opp and fits and legal(cells, tenant, gpus)
    out = cells.allocate(tenant, GPU, gpus, job, opportunistic=opp)
    preempted = isinstance(out, Refusal) and out.reason == "preempt"
    if isinstance(out, Refusal) and out.reason == "preempt":
        assert state(cells) == before  # the refusal changed nothing
        assert out.victims == cells.preemption_victims(tenant, GPU, gpus)
        assert state(cells) == before
        for victim in out.victims:
            cells.release(victim)
        out = cells.allocate(tenant, GPU, gpus, job)
    if check and was_legal:
        assert isinstance(out, Allocation), out  # Theorem 1: every legal request succeeds
    if isinstance(out, Refusal):
        if check and not out.victims:
            assert state(cells) == before  # an illegal request changes nothing
        return out
    if check:  # allocate then release restores the state; then allocate again
        after = state(cells)
        assert sum(p.gpus for p in out.placement) == gpus
        cells.release(job)
        assert preempted or state(cells) == before  # victims stopped: not the same state
        again = cells.allocate(tenant, GPU, gpus, job, opportunistic=opp)
        assert again == out and state(cells) == after
    return out


def usable(cells: Cells, tenant: str, slot: VirtualSlot) -> int | None:
    """GPUs a virtual server can still give: None while its virtual cell is
    unbound (any healthy cell of its level will do, Theorem 1), else the
    healthy GPUs of its node that no guaranteed job holds."""
    root = cells.bindings.cell_of(tenant, GPU, slot.level, slot.index)
    if root is None:
        return None
    chain, tree = cells.model.chains[GPU], cells.tree
    node = root if slot.level <= chain.node_level else tree.below(root, chain.node_level)[
        slot.node]
    held = {leaf for job in cells.jobs.values() if not job.opportunistic for c in job.cells
            for leaf in tree.leaves[c]}  # a job holds the rest of its cells
    return sum(1 for leaf in tree.leaves[node] if leaf not in held and not cells.buddy.bad[leaf])


def step_slots(cells: Cells, tenant: str, gpus: int, two: bool, job: str, check: bool) -> Any:
    """A guaranteed job on one or two of the tenant's virtual servers: it
    succeeds whenever each server has the GPUs (its virtual cell unbound, or
    enough healthy free GPUs in its node), preempting opportunistic jobs."""
    slots = virtual_slots(cells.model, tenant, GPU)
    if not slots:
        return None
    picked = [slots[gpus % len(slots)]] + ([slots[(gpus + 1) % len(slots)]] if two else [])
    parts = [(slot, 1 + (gpus + k) % size) for k, (slot, size) in enumerate(dict(picked).items())]
    before = state(cells)
    room = [usable(cells, tenant, slot) for slot, _ in parts]
    healthy = cells.check_safety() == ()
    was_legal = healthy and all(r is None or r >= g for r, (_, g) in zip(room, parts, strict=True))
    out = cells.allocate_on(tenant, GPU, parts, job)
    preempted = isinstance(out, Refusal) and out.reason == "preempt"
    if isinstance(out, Refusal) and out.reason == "preempt":
        assert state(cells) == before
        for victim in out.victims:
            cells.release(victim)
        out = cells.allocate_on(tenant, GPU, parts, job)
    if check and was_legal and not cells.bad_servers:
        assert isinstance(out, Allocation), (parts, out)
    if isinstance(out, Refusal):
        if check and not preempted:
            assert state(cells) == before
        return out
    if check:
        assert out.gpus == sum(g for _, g in parts)
        for (_, g), (_, size) in zip(parts, picked, strict=False):
            assert size >= g
        roots = {cells.bindings.cell_of(tenant, GPU, s.level, s.index) for s, _ in parts}
        assert all(any(a in roots for a in cells.tree.ancestors(c))
                   for c in cells.jobs[job].cells)  # inside the virtual servers' cells
        after = state(cells)
        cells.release(job)
        assert preempted or state(cells) == before
        again = cells.allocate_on(tenant, GPU, parts, job)
        assert again == out and state(cells) == after
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_properties_hold_after_every_operation(scenario: Any) -> None:
    doc, servers, ops = scenario
    cells = build(doc, servers)
    check_invariants(cells)
    decisions = run(cells, ops, check=True)
    # Deterministic: the same operations on a fresh instance, same decisions and state.
    twin = build(doc, servers)
    assert run(twin, ops, check=False) == decisions
    assert state(twin) == state(cells)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_allocate_then_release_restores_the_state(scenario: Any) -> None:
    doc, servers, ops = scenario
    cells = build(doc, servers)
    run(cells, ops, check=False)
    before = state(cells)
    for i, tenant in enumerate(cells.tenants()):
        for gpus in (1, 2, 3):
            out = cells.allocate(tenant, GPU, gpus, f"x{i}{gpus}")
            if isinstance(out, Allocation):
                cells.release(out.job_id)
            assert state(cells) == before
