"""Reading the cell state out: tenant views, snapshots, and their restore.

The view is HiveD's VC view (§3.1, Figure 2) with its binding to physical
cells, the "VC -> node" picture an operator asks for. The snapshot holds
only what is not derived from the spec (the bindings, the jobs' cells and
the bad servers), in a canonical order; restoring it carves exactly those
cells again, and since the free lists are always maximal buddy blocks the
rebuilt state, and every later decision, is the same (§4 "Fault tolerance":
HiveD rebuilds its free lists from the bindings it persisted).
"""

from __future__ import annotations

from scheduling.cells.buddy import POOL
from scheduling.cells.ledger import Job
from scheduling.cells.ledger import Ledger as Cells
from scheduling.cells.opportunistic import idle
from scheduling.cells.views import (
    BoundCell,
    ChainView,
    LevelCount,
    ServerGpus,
    Snapshot,
    SnapshotBinding,
    SnapshotJob,
    TenantView,
)
from shared.ids import GpuType


def _per_server(cells: Cells, leaves: list[int]) -> tuple[ServerGpus, ...]:
    return cells.tree_placement(leaves)


def _bound_cell(cells: Cells, cell: int) -> BoundCell:
    tree, buddy = cells.tree, cells.buddy
    return BoundCell(tree.address[cell], tree.level[cell], tree.size(cell), buddy.busy[cell],
                     buddy.bad[cell], cell in cells.bindings.doomed,
                     _per_server(cells, list(tree.leaves[cell])))


def _chain_view(cells: Cells, tenant: str, gpu: GpuType, counts: tuple[int, ...]) -> ChainView:
    chain = cells.model.chains[gpu]
    b = cells.bindings
    levels = tuple(LevelCount(lv, chain.types[lv - 1], chain.sizes[lv - 1], n,
                              b.allocated[tenant][gpu][lv - 1])
                   for lv, n in enumerate(counts, start=1) if n)
    bound = sorted(c for c, t in b.bound.items() if t == tenant and cells.tree.chain[c] == gpu)
    views = tuple(_bound_cell(cells, c) for c in bound)
    free_leaves = [leaf for lv in range(1, chain.top + 1)
                   for c in sorted(cells.buddy.sets.get((gpu, lv, tenant), ()))
                   for leaf in cells.tree.leaves[c]
                   if cells.tree.server[leaf] not in cells.bad_servers]
    reserved = sum(n * chain.sizes[lv - 1] for lv, n in enumerate(counts, start=1))
    used = sum(v.used_gpus for v in views)
    bad = sum(v.bad_gpus for v in views)
    unbound = sum(b.unbound(tenant, gpu, lv) * chain.sizes[lv - 1]
                  for lv in range(1, chain.top + 1))
    return ChainView(gpu, levels, views, reserved, used, max(0, reserved - used - bad), bad,
                     unbound, _per_server(cells, free_leaves))


def tenant_view(cells: Cells, tenant: str) -> TenantView:
    """One tenant's virtual cluster, its bindings and its jobs."""
    if tenant not in cells.model.low_priority:
        raise KeyError(tenant)
    chains = tuple(_chain_view(cells, tenant, g, counts)
                   for g, counts in sorted(cells.model.reservations.get(tenant, {}).items()))
    # Holders whose id starts with NUL (a layer's profiling runs and holds)
    # count in the GPUs but are not jobs to list.
    mine = sorted((j, job) for j, job in cells.jobs.items()
                  if job.tenant == tenant and not j.startswith("\x00"))
    opp = [(j, job) for j, job in mine if job.opportunistic]
    return TenantView(tenant, cells.model.low_priority[tenant], cells.model.weights[tenant],
                      chains, tuple(j for j, job in mine if not job.opportunistic),
                      tuple(j for j, _ in opp), sum(job.gpus for _, job in opp))


def snapshot(cells: Cells) -> Snapshot:
    """The state as plain data, in a canonical order."""
    tree = cells.tree
    bindings = tuple(SnapshotBinding(tree.address[c], t, c in cells.bindings.doomed,
                                     cells.bindings.slot[c])
                     for c, t in sorted(cells.bindings.bound.items()))
    jobs = tuple(SnapshotJob(j, job.tenant, job.chain, job.gpus, job.opportunistic,
                             tuple(tree.address[c] for c in job.cells))
                 for j, job in sorted(cells.jobs.items()))
    return Snapshot(bindings, jobs, tuple(sorted(cells.bad_servers)))


def _cell(cells: Cells, address: str) -> int:
    cell = cells.tree.by_address.get(address)
    if cell is None:
        raise ValueError(f"snapshot: no cell {address} in the spec")
    return cell


def restore_into(cells: Cells, snap: Snapshot) -> None:
    """Bring a fresh ledger into the state ``snap`` was taken in;
    ValueError if the snapshot does not fit the spec."""
    for server in snap.bad_servers:
        if server not in cells.tree.node_of:
            raise ValueError(f"snapshot: no cell for server {server}")
        cells.mark_bad(server, True)
    for b in snap.bindings:
        cell = _cell(cells, b.address)
        level, gpu = cells.tree.level[cell], cells.tree.chain[cell]
        if cells.bindings.unbound(b.tenant, gpu, level) <= 0:
            raise ValueError(f"snapshot: tenant {b.tenant} has no virtual cell for {b.address}")
        slot = None if b.slot < 0 else b.slot
        if slot is not None and (slot >= cells.bindings.reserved[b.tenant][gpu][level - 1]
                                 or cells.bindings.cell_of(b.tenant, gpu, level, slot) is not None):
            raise ValueError(f"snapshot: virtual cell {slot} of tenant {b.tenant} for "
                             f"{b.address} is not free")
        if not cells.buddy.carve(cell, POOL):
            raise ValueError(f"snapshot: cell {b.address} is bound twice")
        cells.bindings.bind(cell, b.tenant, b.doomed, slot)
    for j in snap.jobs:
        ids = tuple(_cell(cells, a) for a in j.cells)
        leaves = cells.leaves_of(ids, j.gpus)
        # An opportunistic job uses only its GPUs (leaves): a guaranteed job
        # may hold the rest of its cells.
        for cell in leaves if j.opportunistic else ids:
            ok = (idle(cells.tree, cells.buddy, cell, bad_ok=True) if j.opportunistic
                  else cells.buddy.carve(cell, j.tenant))
            if not ok:
                raise ValueError(f"snapshot: job {j.job_id} cannot hold {cells.tree.address[cell]}")
        cells.record(j.job_id, Job(j.tenant, j.gpu_type, j.gpus, j.opportunistic, ids, leaves))
