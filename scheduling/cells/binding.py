"""Virtual clusters and the dynamic binding of their cells (HiveD §3.1-§3.3).

A tenant's virtual cluster is a count of virtual cells per chain and level
(r_{t,k}). A virtual cell is bound to a physical cell of its level, taken
from the pool by buddy cell allocation (Algorithm 1), when the tenant first
uses it, and unbound when it is wholly free again (§3.1: "When none of the
GPUs is in use, the cell will be de-allocated"). Inside a bound cell the
tenant's jobs are placed by the same algorithm on the tenant's own free
lists, which is the private cluster of its VC view. Theorem 1 makes every
legal binding succeed: a_{t,k} < r_{t,k}.

Bad hardware (§4 "Handling faulty hardware"): choices prefer healthy cells;
when the pool cannot give every unbound virtual cell a healthy physical
cell any more, the missing ones are bound "doomed" to bad cells, so the
tenant's view shows the capacity it lost instead of promising it.
"""

from __future__ import annotations

import heapq
from typing import Literal

from scheduling.cells.buddy import FREE, POOL, Buddy
from scheduling.cells.spec import CellModel
from scheduling.cells.tree import Tree
from shared.ids import GpuType

PlaceFailure = Literal["no-cell", "unhealthy"]


class Bindings:
    """r_{t,k}, a_{t,k} and the bound physical cells."""

    def __init__(self, model: CellModel, tree: Tree, buddy: Buddy) -> None:
        self.tree, self.buddy = tree, buddy
        self.reserved: dict[str, dict[GpuType, tuple[int, ...]]] = model.reservations
        self.allocated: dict[str, dict[GpuType, list[int]]] = {
            t: {g: [0] * len(v) for g, v in chains.items()}
            for t, chains in model.reservations.items()}
        self.bound: dict[int, str] = {}
        self.doomed: set[int] = set()  # bound cells that are doomed
        # Which of its tenant's virtual cells of the level (by index) a bound
        # cell is: the identity the VC view's virtual servers are bound by.
        self.slot: dict[int, int] = {}
        # While pinned, a bound cell that falls wholly free stays bound, so a
        # plan that releases jobs and places them again keeps each virtual
        # cell on its physical cell (see Ledger.pin).
        self.pinned = False
        self.by_slot: dict[tuple[str, GpuType, int, int], int] = {}
        self._free_slots: dict[tuple[str, GpuType, int], list[int]] = {}  # heaps

    def unbound(self, tenant: str, chain: GpuType, level: int) -> int:
        """r_{t,k} - a_{t,k}: the tenant's virtual cells of a level not bound."""
        counts = self.reserved.get(tenant, {}).get(chain)
        if counts is None or level > len(counts):
            return 0
        return counts[level - 1] - self.allocated[tenant][chain][level - 1]

    def bind(self, cell: int, tenant: str, doomed: bool = False, slot: int | None = None
             ) -> None:
        """Bind a cell already taken off the pool's lists to a virtual cell:
        the one of index ``slot``, else the lowest unbound one (a doomed
        cell: the highest, so that the lost capacity sits on the tenant's
        last virtual servers)."""
        level, chain = self.tree.level[cell], self.tree.chain[cell]
        if slot is None:
            slot = self._highest_free(tenant, chain, level) if doomed else self._lowest_free(
                tenant, chain, level)
        self.allocated[tenant][chain][level - 1] += 1
        self.bound[cell] = tenant
        self.slot[cell] = slot
        self.by_slot[(tenant, chain, level, slot)] = cell
        if doomed:
            self.doomed.add(cell)
        self.buddy.add(cell, tenant)

    def _lowest_free(self, tenant: str, chain: GpuType, level: int) -> int:
        """The lowest index of the tenant's unbound virtual cells of a level:
        a heap per level, whose bound entries are dropped when they reach
        the top (a tenant may reserve thousands of cells of a level)."""
        key = (tenant, chain, level)
        heap = self._free_slots.get(key)
        if heap is None:
            heap = self._free_slots[key] = [
                i for i in range(self.reserved[tenant][chain][level - 1])
                if (tenant, chain, level, i) not in self.by_slot]
        while (tenant, chain, level, heap[0]) in self.by_slot:
            heapq.heappop(heap)
        return heap[0]

    def _highest_free(self, tenant: str, chain: GpuType, level: int) -> int:
        return max(i for i in range(self.reserved[tenant][chain][level - 1])
                   if (tenant, chain, level, i) not in self.by_slot)

    def cell_of(self, tenant: str, chain: GpuType, level: int, slot: int) -> int | None:
        """The physical cell the tenant's virtual cell ``slot`` of a level is bound to."""
        return self.by_slot.get((tenant, chain, level, slot))

    def unbind(self, cell: int) -> None:
        """Give a wholly free bound cell back to the pool (RELEASECELL)."""
        tenant = self.bound.pop(cell)
        self.doomed.discard(cell)
        slot = self.slot.pop(cell)
        chain, level = self.tree.chain[cell], self.tree.level[cell]
        del self.by_slot[(tenant, chain, level, slot)]
        heap = self._free_slots.get((tenant, chain, level))
        if heap is not None:
            heapq.heappush(heap, slot)
        self.allocated[tenant][self.tree.chain[cell]][self.tree.level[cell] - 1] -= 1
        self.buddy.remove(cell)
        self.buddy.put(cell, POOL)

    def root(self, cell: int) -> int:
        """The bound cell holding ``cell``."""
        while cell not in self.bound:
            cell = self.tree.parent[cell]
        return cell

    def can_place(self, tenant: str, chain: GpuType, level: int) -> bool:
        """Whether a level-``level`` cell is legal for the tenant now: a free
        part of a bound cell, or an unbound virtual cell, at that level or above."""
        top = self.tree.chains[chain].top
        return any(self.buddy.best(chain, lv, tenant, healthy=False) is not None
                   or self.unbound(tenant, chain, lv) > 0 for lv in range(level, top + 1))

    def place(self, tenant: str, chain: GpuType, level: int) -> int | PlaceFailure:
        """A level-``level`` cell for one of the tenant's jobs, taken off its
        lists: the smallest level first, a free part of a bound cell before
        binding another virtual cell of that level."""
        top = self.tree.chains[chain].top
        for lv in range(level, top + 1):
            if self.buddy.best(chain, lv, tenant) is not None:
                break
            if self.unbound(tenant, chain, lv) > 0:
                cell = self.buddy.take(chain, lv, POOL)
                if cell is None:
                    continue  # every free cell there is bad: a larger virtual cell may do
                self.bind(cell, tenant)
                part = self.tree.below(cell, level)[0]  # the cell is healthy: so is this
                carved = self.buddy.carve(part, tenant)
                assert carved
                return part
        else:
            inside = self.buddy.take(chain, level, tenant)  # healthy, in a partly bad cell
            if inside is not None:
                return inside
            return "no-cell" if not self.can_place(tenant, chain, level) else "unhealthy"
        taken = self.buddy.take(chain, level, tenant)
        assert taken is not None  # a healthy free cell at or above ``level`` exists
        return taken

    def unplace(self, cell: int, tenant: str) -> None:
        """A job's cell is free again: merge it inside its bound cell, and
        unbind that cell when it is wholly free (unless doomed)."""
        root = self.root(cell)
        ended = self.buddy.put(cell, tenant, stop=root)
        if ended == root and root not in self.doomed and not self.pinned:
            self.unbind(root)

    def settle(self) -> None:
        """End a pin: unbind the bound cells that are wholly free (not doomed)."""
        self.pinned = False
        for cell in sorted(self.bound):
            if (cell not in self.doomed and self.buddy.state[cell] == FREE
                    and self.buddy.owner[cell] == self.bound[cell]):
                self.unbind(cell)

    def refresh_doomed(self) -> None:
        """Adjust the doomed cells after a change of health or of free cells
        (§4; hivedscheduler issue #25): give back idle doomed cells where
        healthy ones are to spare, then bind bad cells to the virtual cells
        the healthy pool can no longer hold. Doomed cells that stay needed
        keep their tenant, so a release undoes an allocation exactly."""
        for cell in sorted(self.doomed):
            if not self.buddy.bad[cell]:  # healed: an ordinary binding, unbound when idle
                self.doomed.discard(cell)
                if self.buddy.state[cell] == FREE and self.buddy.owner[cell] == self.bound[cell]:
                    self.unbind(cell)
        for chain in sorted(self.tree.chains):
            while self._give_back_doomed(chain):
                pass
            self._walk(chain, doom=True)

    def _give_back_doomed(self, chain: GpuType) -> bool:
        surplus = self._walk(chain, doom=False)
        for level in sorted(surplus, reverse=True):
            if surplus[level] <= 0:
                continue
            idle = [c for c in sorted(self.doomed, reverse=True)
                    if self.tree.chain[c] == chain and self.tree.level[c] == level
                    and self.buddy.state[c] == FREE and self.buddy.owner[c] == self.bound[c]]
            if idle:
                self.unbind(idle[0])
                return True
        return False

    def _walk(self, chain: GpuType, doom: bool) -> dict[int, int]:
        """Walk the levels top-down as Eqn. (1) does, counting only wholly
        healthy cells as available; with ``doom``, bind a bad cell for each
        shortfall. Returns the healthy cells to spare at each level."""
        by_level: dict[int, list[int]] = {}
        for lk, cells in self.buddy.sets.items():
            if lk[0] == chain and lk[2] == POOL:
                by_level.setdefault(lk[1], []).extend(cells)
        carried: list[int] = []
        surplus: dict[int, int] = {}
        for level in range(self.tree.chains[chain].top, 0, -1):
            here = sorted(by_level.get(level, []) + carried)
            need = sum(self.unbound(t, chain, level) for t in sorted(self.reserved))
            healthy = [c for c in here if not self.buddy.bad[c]]
            bad = sorted((c for c in here if self.buddy.bad[c]),
                         key=lambda c: (self.buddy.bad[c], c))
            short = max(0, need - len(healthy))
            surplus[level] = len(healthy) - need
            if doom:
                for cell in bad[:short]:
                    self._doom(cell, chain, level)
            kept = set(healthy[:need]) | set(bad[:short])
            carried = [k for c in here if c not in kept for k in self.tree.children[c]]
        return surplus

    def _doom(self, cell: int, chain: GpuType, level: int) -> None:
        tenants = sorted(self.reserved, key=lambda t: (-self.unbound(t, chain, level), t))
        tenant = tenants[0]
        if self.unbound(tenant, chain, level) <= 0 or not self.buddy.carve(cell, POOL):
            return
        self.bind(cell, tenant, doomed=True)
