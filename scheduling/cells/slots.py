"""Guaranteed jobs placed on named virtual servers (HiveD §3.1-§3.2).

The VC view shows a tenant its virtual cells as servers: one per node of a
reserved cell at node level or above, one per reserved cell below it
(Figure 3: "a private cluster consisting of nodes with different sizes").
The inner policy places a job on some of them. Here each virtual cell is
bound one to one to a physical cell of its level (buddy cell allocation,
Algorithm 1, at the virtual cell's own level, so Theorem 1 covers it), and
a virtual server of that cell to one node of it, and the job's GPUs on a
virtual server are taken inside that node. So every placement the view
allows can be bound: the tenant's cells behave as the private cluster of
its reservation, whatever the other tenants do.

Inside a node the choice keeps buddies whole: a free cell of exactly the
job's GPUs when there is a clean one, else single GPUs from the smallest
free blocks first. GPUs of opportunistic jobs are taken last, and the jobs
on them are named for preemption (§3.3); bad GPUs are never taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from scheduling.cells.binding import Bindings
from scheduling.cells.buddy import FREE, INNER, POOL, SPLIT, Buddy
from scheduling.cells.spec import CellModel, Chain
from scheduling.cells.tree import Tree
from scheduling.cells.views import Refusal, VirtualSlot
from shared.ids import GpuType

Part = tuple[VirtualSlot, int]


class HeldCells(Protocol):
    """A job's hold on the cells, as the ledger records it."""

    @property
    def tenant(self) -> str: ...  # "" for GPUs held outside the cells
    @property
    def leaves(self) -> tuple[int, ...]: ...


class Ledger(Protocol):
    """What placement reads and changes of :class:`~scheduling.cells.ledger.Ledger`.
    Named by its shape so that the ledger can call this module without the
    two importing each other."""

    model: CellModel
    tree: Tree
    buddy: Buddy
    bindings: Bindings

    @property
    def jobs(self) -> Mapping[str, HeldCells]: ...
    def slot_sizes(self, tenant: str, gpu_type: GpuType) -> dict[VirtualSlot, int]: ...
    def unknown(self, tenant: str, gpu_type: GpuType, job_id: str) -> Refusal | None: ...
    def overlap(self, cells: list[int]) -> tuple[str, ...]: ...


def virtual_slots(model: CellModel, tenant: str, gpu: GpuType) -> tuple[tuple[VirtualSlot, int],
                                                                      ...]:
    """The tenant's virtual servers of one chain with their GPUs, largest
    cells first: one per node of each reserved cell at node level or above,
    one per reserved cell below node level."""
    chain = model.chains[gpu]
    counts = model.reservations.get(tenant, {}).get(gpu, ())
    node = chain.sizes[chain.node_level - 1]
    out: list[tuple[VirtualSlot, int]] = []
    for level in range(len(counts), 0, -1):
        size = chain.sizes[level - 1]
        for i in range(counts[level - 1]):
            if level >= chain.node_level:
                out += [(VirtualSlot(level, i, j), node) for j in range(size // node)]
            else:
                out.append((VirtualSlot(level, i, 0), size))
    return tuple(out)


def place_on(led: Ledger, tenant: str, gpu: GpuType, parts: Sequence[Part], job_id: str
             ) -> list[int] | Refusal:
    """Take the cells of a guaranteed job with ``gpus`` GPUs on each of the
    tenant's virtual servers ``slot`` (the caller records the job); all or
    nothing, and a refusal changes nothing."""
    refusal = _check(led, tenant, gpu, parts, job_id)
    if refusal is not None:
        return refusal
    chain = led.model.chains[gpu]
    bound: list[int] = []
    taken: list[int] = []
    for slot, gpus in parts:
        target = _target(led, tenant, chain, slot, bound)
        if target is None:
            return _undo(led, tenant, bound, taken, Refusal(
                job_id, "unhealthy", f"only bad {gpu} cells are left for virtual cell {slot}"))
        cells = _pick(led, target, gpus)
        if cells is None:
            return _undo(led, tenant, bound, taken, Refusal(
                job_id, "no-cell", f"virtual server {_name(slot)} of tenant {tenant} has "
                f"fewer than {gpus} usable {gpu} GPUs"))
        for cell in cells:
            ok = led.buddy.carve(cell, tenant)
            assert ok  # _pick chose free cells of this tenant
        taken += cells
    victims = led.overlap(taken)
    if victims:
        return _undo(led, tenant, bound, taken, Refusal(
            job_id, "preempt", "opportunistic jobs hold the GPUs", victims))
    return taken


def unavailable(led: Ledger, tenant: str, gpu: GpuType) -> dict[VirtualSlot, int]:
    """Per bound virtual server, its GPUs that are bad or held outside the
    cells (:meth:`Ledger.hold`): the capacity the view must not promise."""
    held = {leaf for job in led.jobs.values() if not job.tenant for leaf in job.leaves}
    chain = led.model.chains[gpu]
    out: dict[VirtualSlot, int] = {}
    for slot, _ in virtual_slots(led.model, tenant, gpu):
        root = led.bindings.cell_of(tenant, gpu, slot.level, slot.index)
        if root is None:
            continue
        target = _node(led, chain, root, slot)
        lost = sum(1 for leaf in led.tree.leaves[target]
                   if led.buddy.bad[leaf] or leaf in held)
        if lost:
            out[slot] = lost
    return out


def _name(slot: VirtualSlot) -> str:
    return f"{slot.level}.{slot.index}.{slot.node}"


def _check(led: Ledger, tenant: str, gpu: GpuType, parts: Sequence[Part], job_id: str
           ) -> Refusal | None:
    refusal = led.unknown(tenant, gpu, job_id)
    if refusal is not None:
        return refusal
    if not parts or len({s for s, _ in parts}) != len(parts) or min(g for _, g in parts) < 1:
        raise ValueError(f"job {job_id}: parts must name distinct virtual servers, "
                         f"each with at least one GPU: {list(parts)}")
    sizes = led.slot_sizes(tenant, gpu)
    for slot, gpus in parts:
        if slot not in sizes:
            return Refusal(job_id, "no-cell", f"tenant {tenant} has no {gpu} virtual server "
                           f"{_name(slot)}")
        if gpus > sizes[slot]:
            return Refusal(job_id, "too-large", f"{gpus} GPUs exceed virtual server "
                           f"{_name(slot)} of {sizes[slot]}")
    return None


def _node(led: Ledger, chain: Chain, root: int, slot: VirtualSlot) -> int:
    if slot.level <= chain.node_level:
        return root
    return led.tree.below(root, chain.node_level)[slot.node]


def _target(led: Ledger, tenant: str, chain: Chain, slot: VirtualSlot, bound: list[int]
            ) -> int | None:
    """The physical cell a virtual server stands for, binding its virtual
    cell to a pool cell of the same level first if it is not bound yet."""
    root = led.bindings.cell_of(tenant, chain.gpu_type, slot.level, slot.index)
    if root is None:
        root = led.buddy.take(chain.gpu_type, slot.level, POOL)
        if root is None:
            return None
        led.bindings.bind(root, tenant, slot=slot.index)
        bound.append(root)
    return _node(led, chain, root, slot)


def _free_blocks(led: Ledger, target: int) -> list[int]:
    """The maximal free cells inside ``target`` (``target`` itself when it
    lies wholly in a free cell)."""
    buddy, tree = led.buddy, led.tree
    up = target
    while buddy.state[up] == INNER and tree.parent[up] >= 0:
        up = tree.parent[up]
    if buddy.state[up] == FREE:
        return [target]
    if buddy.state[target] != SPLIT:
        return []
    out: list[int] = []
    stack = [target]
    while stack:
        cell = stack.pop()
        if buddy.state[cell] == FREE:
            out.append(cell)
        elif buddy.state[cell] == SPLIT:
            stack.extend(tree.children[cell])
    return sorted(out)


def _pick(led: Ledger, target: int, gpus: int) -> list[int] | None:
    """The cells inside ``target`` to take for ``gpus`` GPUs; None when
    fewer usable GPUs are free there."""
    buddy, tree = led.buddy, led.tree
    blocks = _free_blocks(led, target)
    exact = [c for b in blocks for lv in range(1, tree.level[b] + 1)
             if tree.chains[tree.chain[b]].sizes[lv - 1] == gpus for c in tree.below(b, lv)]
    clean = [c for c in exact if not (buddy.bad[c] or buddy.opp[c])]
    if clean:
        return [min(clean)]
    leaves = sorted((buddy.opp[leaf] > 0, tree.size(b), leaf) for b in blocks
                     for leaf in tree.leaves[b] if not buddy.bad[leaf])
    if len(leaves) < gpus:
        return None
    return sorted(leaf for _, _, leaf in leaves[:gpus])


def _undo(led: Ledger, tenant: str, bound: list[int], taken: list[int], refusal: Refusal
          ) -> Refusal:
    for cell in reversed(taken):
        led.bindings.unplace(cell, tenant)
    for root in reversed(bound):
        if root in led.bindings.bound and led.buddy.state[root] == FREE:
            led.bindings.unbind(root)
    return refusal
