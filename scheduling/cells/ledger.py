"""The allocation state behind the cell facade (HiveD §3, Figure 2).

:class:`Ledger` holds the allocation state of one cluster like a ledger:
``allocate`` and ``release`` change it, every other method reads it, and
every result is a frozen value. The same calls in the same order give the
same state and the same decisions: iteration is sorted and every choice has
a canonical tie-break (:mod:`scheduling.cells.buddy`).

A job of n GPUs holds one cell of the smallest level with at least n GPUs
(§3.2: all level-k cells are equivalent for a level-k request); above node
level, when its tenant has no such cell free, it holds ceil(n / node GPUs)
node-level cells instead, as HiveD gangs one cell per pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduling.cells.binding import Bindings
from scheduling.cells.buddy import POOL, USED, Buddy
from scheduling.cells.opportunistic import idle, idle_cells
from scheduling.cells.slots import Part, place_on, unavailable, virtual_slots
from scheduling.cells.spec import CellModel, Chain, shortfall
from scheduling.cells.tree import Tree
from scheduling.cells.views import Allocation, Refusal, ServerGpus, Violation, VirtualSlot
from shared.ids import GpuType, ServerId


@dataclass(frozen=True)
class Job:
    tenant: str
    chain: GpuType
    gpus: int
    opportunistic: bool
    cells: tuple[int, ...]
    leaves: tuple[int, ...]


def shapes(chain: Chain, gpus: int) -> list[tuple[int, int]]:
    """The (level, cell count) ways a job of ``gpus`` GPUs may be held, preferred first."""
    out = []
    level = chain.level_for(gpus)
    if level is not None:
        out.append((level, 1))
    if level is None or level > chain.node_level:
        node = chain.sizes[chain.node_level - 1]
        if -(-gpus // node) > 1:
            out.append((chain.node_level, -(-gpus // node)))
    return out


class Ledger:
    """Buddy cell allocation with virtual clusters, over one cell model."""

    def __init__(self, model: CellModel) -> None:
        self.model = model
        self.tree = Tree(model)
        self.buddy = Buddy(self.tree)
        self.bindings = Bindings(model, self.tree, self.buddy)
        self.jobs: dict[str, Job] = {}
        self.bad_servers: set[ServerId] = set()
        self._placements: dict[int, tuple[ServerGpus, ...]] = {}  # derived from the tree only
        self._slot_sizes: dict[tuple[str, GpuType], dict[VirtualSlot, int]] = {}

    # -- requests -------------------------------------------------------

    def allocate(self, tenant: str, gpu_type: GpuType, gpus: int, job_id: str,
                 opportunistic: bool = False) -> Allocation | Refusal:
        """Place a job: in the tenant's virtual cells (guaranteed), or, when
        ``opportunistic`` or the tenant is low-priority, on idle cells of
        anyone. A refusal changes nothing."""
        if gpus < 1:
            raise ValueError(f"a job needs at least one GPU, got {gpus}")
        refusal = self._check(tenant, gpu_type, gpus, job_id)
        if refusal is not None:
            return refusal
        chain = self.model.chains[gpu_type]
        if opportunistic or self.model.low_priority[tenant]:
            return self._opportunistic(tenant, chain, gpus, job_id)
        return self._guaranteed(tenant, chain, gpus, job_id)

    def allocate_on(self, tenant: str, gpu_type: GpuType, parts: Sequence[Part], job_id: str
                    ) -> Allocation | Refusal:
        """Place a guaranteed job on named virtual servers of the tenant's VC
        view (:mod:`scheduling.cells.slots`): ``gpus`` GPUs on each
        ``slot``, binding each virtual cell one to one to a physical cell of
        its level when first used. A refusal changes nothing."""
        taken = place_on(self, tenant, gpu_type, parts, job_id)
        if isinstance(taken, Refusal):
            return taken
        leaves = tuple(leaf for c in taken for leaf in self.tree.leaves[c])
        return self.record(job_id, Job(tenant, gpu_type, len(leaves), False, tuple(taken),
                                       leaves))

    def slot_sizes(self, tenant: str, gpu_type: GpuType) -> dict[VirtualSlot, int]:
        """The tenant's virtual servers of a chain with their GPUs (derived
        from the spec once: a tenant may have thousands)."""
        key = (tenant, gpu_type)
        if key not in self._slot_sizes:
            self._slot_sizes[key] = dict(virtual_slots(self.model, tenant, gpu_type))
        return self._slot_sizes[key]

    def unavailable(self, tenant: str, gpu_type: GpuType) -> dict[VirtualSlot, int]:
        """Per bound virtual server of the tenant, its GPUs that are bad or
        held outside the cells: what its VC view must not offer."""
        return unavailable(self, tenant, gpu_type)

    def unknown(self, tenant: str, gpu_type: GpuType, job_id: str) -> Refusal | None:
        """A request's tenant, GPU type or job id that cannot be taken."""
        if tenant not in self.model.low_priority:
            return Refusal(job_id, "unknown-tenant", f"no virtual cluster for tenant {tenant}")
        if gpu_type not in self.model.chains:
            return Refusal(job_id, "unknown-gpu-type", f"no cells of GPU type {gpu_type}")
        if job_id in self.jobs:
            return Refusal(job_id, "duplicate-job", f"job {job_id} already holds cells")
        return None

    def _check(self, tenant: str, gpu_type: GpuType, gpus: int, job_id: str) -> Refusal | None:
        refusal = self.unknown(tenant, gpu_type, job_id)
        if refusal is not None:
            return refusal
        if not shapes(self.model.chains[gpu_type], gpus):
            return Refusal(job_id, "too-large", f"{gpus} GPUs exceed every {gpu_type} cell")
        return None

    def _guaranteed(self, tenant: str, chain: Chain, gpus: int, job_id: str
                    ) -> Allocation | Refusal:
        reason = "no-cell"
        for level, count in shapes(chain, gpus):
            cells = self._place_many(tenant, chain.gpu_type, level, count)
            if isinstance(cells, str):
                reason = cells if cells == "unhealthy" else reason
                continue
            victims = self.overlap(cells)
            if victims:
                for cell in reversed(cells):
                    self.bindings.unplace(cell, tenant)
                clean = self._clean(tenant, chain.gpu_type, level) if count == 1 else None
                if clean is None:
                    return Refusal(job_id, "preempt", "opportunistic jobs hold the cell", victims)
                cells = [clean]
            return self.record(job_id, Job(tenant, chain.gpu_type, gpus, False, tuple(cells),
                                             self.leaves_of(cells, gpus)))
        detail = (f"tenant {tenant} has no free {chain.gpu_type} cell for {gpus} GPUs"
                  if reason == "no-cell" else "only cells with bad GPUs are left")
        return Refusal(job_id, "no-cell" if reason == "no-cell" else "unhealthy", detail)

    def _clean(self, tenant: str, gpu: GpuType, level: int) -> int | None:
        """A level-``level`` cell no opportunistic job (nor a GPU held
        outside the cells) touches: inside a free part of the tenant's bound
        cells, else in a clean pool cell bound to one of its unbound virtual
        cells (a legal allocation, so invariant (2) holds as for any other);
        None when there is none. The buddy's choice takes a free cell of the
        level itself before splitting a larger one or binding another
        (Algorithm 1), so it may pick a held one while a clean one is to be
        had: preempting then would stop jobs, or refuse, for nothing."""
        top = self.tree.chains[gpu].top
        for lv in range(level, top + 1):
            for cell in sorted(self.buddy.sets.get((gpu, lv, tenant), ())):
                if not (self.buddy.opp[cell] or self.buddy.bad[cell]):
                    return self._carve(cell, tenant, level)
        for vl in range(level, top + 1):
            if self.bindings.unbound(tenant, gpu, vl) > 0:
                bound = self._bind_clean(tenant, gpu, vl)
                if bound is not None:
                    return self._carve(bound, tenant, level)
        return None

    def _bind_clean(self, tenant: str, gpu: GpuType, level: int) -> int | None:
        """Bind one of the tenant's unbound level-``level`` virtual cells to
        a clean pool cell, carved from a larger free one where needed. This
        may split a larger cell while a held cell of the level is free,
        which Algorithm 1 would not do, so the binding is kept only when
        invariant (2) still holds everywhere (else undone: None)."""
        top = self.tree.chains[gpu].top
        for lv in range(level, top + 1):
            for cell in sorted(self.buddy.sets.get((gpu, lv, POOL), ())):
                if self.buddy.opp[cell] or self.buddy.bad[cell]:
                    continue
                part = cell if lv == level else self.tree.below(cell, level)[0]
                if not self.buddy.carve(part, POOL):
                    continue
                self.bindings.bind(part, tenant)
                if not self.check_safety():
                    return part
                self.bindings.unbind(part)
                return None
        return None

    def _carve(self, cell: int, tenant: str, level: int) -> int | None:
        part = cell if self.tree.level[cell] == level else self.tree.below(cell, level)[0]
        return part if self.buddy.carve(part, tenant) else None

    def _place_many(self, tenant: str, chain: GpuType, level: int, count: int) -> list[int] | str:
        """``count`` cells or a failure, all or nothing."""
        cells: list[int] = []
        for _ in range(count):
            cell = self.bindings.place(tenant, chain, level)
            if isinstance(cell, str):
                for done in reversed(cells):
                    self.bindings.unplace(done, tenant)
                return cell
            cells.append(cell)
        return cells

    def overlap(self, cells: list[int]) -> tuple[str, ...]:
        """The opportunistic jobs (and holds) on GPUs of ``cells``."""
        if not any(self.buddy.opp[c] for c in cells):
            return ()
        return tuple(sorted(j for j, job in self.jobs.items() if job.opportunistic
                            and any(self._inside(leaf, cells) for leaf in job.leaves)))

    def _inside(self, leaf: int, cells: list[int]) -> bool:
        return any(a in cells for a in self.tree.ancestors(leaf))

    def _opportunistic(self, tenant: str, chain: Chain, gpus: int, job_id: str
                       ) -> Allocation | Refusal:
        for level, count in shapes(chain, gpus):
            cells = idle_cells(self.tree, self.buddy, self.bindings, chain.gpu_type, level, count)
            if cells is not None:
                return self.record(job_id, Job(tenant, chain.gpu_type, gpus, True, tuple(cells),
                                                self.leaves_of(cells, gpus)))
        return Refusal(job_id, "no-capacity", f"no idle {chain.gpu_type} cell for {gpus} GPUs")

    def hold(self, server: ServerId, gpus: int, holder: str) -> int:
        """Keep up to ``gpus`` idle GPUs of ``server`` from every allocation:
        GPUs busy outside the cells (a profiling run, a job the cells do not
        know). They count as opportunistic, so a guaranteed job whose cell
        holds them is refused with ``preempt`` naming ``holder``, and the
        binding avoids them where it can (§3.3). Returns how many GPUs were
        held; :meth:`release` of ``holder`` gives them back. While a hold
        lasts, :meth:`opportunistic_gpus` is not to be read."""
        node = self.tree.node_of.get(server)
        if node is None or gpus < 1 or holder in self.jobs:
            return 0
        free = [c for c in self.tree.leaves[node] if idle(self.tree, self.buddy, c)]
        # Outside bound cells first, then the last GPUs: allocation packs
        # from the lowest ids, so the cells it takes next stay whole.
        free.sort(key=lambda c: (any(a in self.bindings.bound for a in self.tree.ancestors(c)), -c))
        leaves = tuple(free[:gpus])
        if leaves:
            self.record(holder, Job("", self.tree.chain[node], len(leaves), True, leaves, leaves))
        return len(leaves)

    def leaves_of(self, cells: list[int] | tuple[int, ...], gpus: int) -> tuple[int, ...]:
        """The GPUs a job uses: the first leaves of its cells, filled in turn."""
        out: list[int] = []
        for cell in cells:
            out.extend(self.tree.leaves[cell][:gpus - len(out)])
        return tuple(out)

    def record(self, job_id: str, job: Job) -> Allocation:
        self.jobs[job_id] = job
        self._mark(job, +1)
        return self.allocation(job_id)

    def _mark(self, job: Job, sign: int) -> None:
        """Count the job's GPUs in the cells above them (the choice keys)."""
        if job.opportunistic:
            for leaf in job.leaves:
                for a in self.tree.ancestors(leaf):
                    self.buddy.opp[a] += sign
                    self.buddy.rekey(a)
            return
        for cell in job.cells:
            size = self.tree.size(cell)
            if sign > 0:
                self.buddy.state[cell] = USED
                self.buddy.owner[cell] = job.tenant
            for a in self.tree.ancestors(cell):
                self.buddy.busy[a] += sign * size

    def release(self, job_id: str) -> bool:
        """Free a job's cells (RELEASECELL); False for an unknown job."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return False
        self._mark(job, -1)
        if not job.opportunistic:
            for cell in job.cells:
                self.bindings.unplace(cell, job.tenant)
            if self.bad_servers or self.bindings.doomed:
                self.bindings.refresh_doomed()
        return True

    def pin(self) -> None:
        """Keep every bound cell bound, even wholly free, until :meth:`settle`:
        a plan that releases its jobs and places them again then finds each
        virtual cell on the physical cell it had, as a private cluster keeps
        its servers (a job placed where it was is not moved)."""
        self.bindings.pinned = True

    def settle(self) -> None:
        """End :meth:`pin`: unbind the bound cells left wholly free."""
        self.bindings.settle()
        if self.bad_servers or self.bindings.doomed:
            self.bindings.refresh_doomed()

    def set_health(self, server: ServerId, healthy: bool) -> None:
        """Mark a server bad (dead or removed) or good again."""
        if server not in self.tree.node_of or (server not in self.bad_servers) == healthy:
            return
        self.mark_bad(server, not healthy)
        self.bindings.refresh_doomed()

    def mark_bad(self, server: ServerId, bad: bool) -> None:
        """Count a server's GPUs as bad or good in the cells above them,
        without rebinding (for :func:`restore`)."""
        (self.bad_servers.add if bad else self.bad_servers.discard)(server)
        self.buddy.any_bad = bool(self.bad_servers)
        for leaf in self.tree.leaves[self.tree.node_of[server]]:
            for a in self.tree.ancestors(leaf):
                self.buddy.bad[a] += 1 if bad else -1
                self.buddy.rekey(a)

    # -- reading --------------------------------------------------------

    def allocation(self, job_id: str) -> Allocation:
        """The placement of a job that holds cells."""
        job = self.jobs[job_id]
        if len(job.cells) == 1 and job.gpus == self.tree.size(job.cells[0]):
            placement = self._whole(job.cells[0])  # a rack's 1,024 servers, built once
        else:
            placement = self.tree_placement(job.leaves)
        return Allocation(job_id, job.tenant, job.chain, job.gpus, job.opportunistic,
                          tuple(self.tree.address[c] for c in job.cells), placement)

    def tree_placement(self, leaves: tuple[int, ...] | list[int]) -> tuple[ServerGpus, ...]:
        """GPUs per server, sorted by server id."""
        per: dict[ServerId, list[int]] = {}
        for leaf in leaves:
            server = self.tree.server[leaf]
            assert server is not None
            per.setdefault(server, []).append(self.tree.gpu_index[leaf])
        return tuple(ServerGpus(s, len(ix), tuple(sorted(ix))) for s, ix in sorted(per.items()))

    def _whole(self, cell: int) -> tuple[ServerGpus, ...]:
        found = self._placements.get(cell)
        if found is None:
            found = self._placements[cell] = self.tree_placement(self.tree.leaves[cell])
        return found

    def preemption_victims(self, tenant: str, gpu_type: GpuType, gpus: int) -> tuple[str, ...]:
        """The opportunistic jobs to stop before a guaranteed job of the
        tenant can have its cell (the binding already chose the cell with
        the fewest opportunistic GPUs); empty when none need to stop or the
        job cannot be placed anyway."""
        probe = "\x00probe"
        result = self.allocate(tenant, gpu_type, gpus, probe)
        if isinstance(result, Allocation):
            self.release(probe)
            return ()
        return result.victims

    def fits(self, tenant: str, gpu_type: GpuType, gpus: int) -> bool:
        """Whether the tenant's virtual cluster could ever hold the job as a
        guaranteed one (for admission: a job no cell can hold is refused)."""
        chain = self.model.chains.get(gpu_type)
        counts = self.model.reservations.get(tenant, {}).get(gpu_type)
        if chain is None or counts is None:
            return False
        for level, count in shapes(chain, gpus):
            cells = sum(n * chain.sizes[lv - 1] // chain.sizes[level - 1]
                        for lv, n in enumerate(counts, start=1) if lv >= level)
            if cells >= count:
                return True
        return False

    def check_safety(self) -> tuple[Violation, ...]:
        """Every chain and level where Theorem 1's invariant (2),
        r_k - a_k <= f_k + F_k, does not hold (empty when safe)."""
        out = []
        for gpu, chain in sorted(self.model.chains.items()):
            need = [sum(self.bindings.unbound(t, gpu, lv) for t in self.model.reservations)
                    for lv in range(1, chain.top + 1)]
            free = [len(self.buddy.sets.get((gpu, lv, POOL), ()))
                    for lv in range(1, chain.top + 1)]
            while True:
                short = shortfall(chain, free, need)
                if short is None:
                    break
                level, unallocated, available = short
                out.append(Violation(gpu, level, unallocated, available))
                need[level - 1] = available  # report the levels below on their own
        return tuple(out)
