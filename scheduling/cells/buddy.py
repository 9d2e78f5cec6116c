"""Buddy cell allocation (HiveD §3.3, Algorithm 1).

Free cells are kept at the highest possible level: one free list per chain,
level and owner. The owner is the pool (``POOL``, cells bound to no virtual
cell: the paper's global free lists) or a tenant (the free parts of the
physical cells bound to that tenant's virtual cells). Allocating a level-k
cell takes a free one, or splits one taken recursively from level k+1
(ALLOCATECELL); releasing adds it back and merges it with its buddies while
they are all free (RELEASECELL). Both walk at most one path of the tree:
O(levels), plus the split or merge of one cell's children.

Among free cells of a level the choice is canonical: the one with no bad
GPU, then the fewest GPUs of opportunistic jobs (§3.3: "chooses the free
cells with the fewest GPUs used by low-priority jobs"), then the lowest id.
Each free list is a set with a heap of (key, id) entries; an entry whose
cell has left the list or whose key has changed is dropped when it reaches
the top, so the choice never depends on history.
"""

from __future__ import annotations

import heapq

from scheduling.cells.tree import Tree
from shared.ids import GpuType

POOL = ""  # the owner of unbound cells
FREE, SPLIT, USED, INNER = 0, 1, 2, 3  # INNER: inside a free or used cell

ListKey = tuple[GpuType, int, str]
Entry = tuple[int, int, int]


class Buddy:
    """The free lists and per-cell counters over one :class:`Tree`."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        n = len(tree)
        self.state = [INNER] * n
        self.owner = [POOL] * n
        self.opp = [0] * n  # GPUs of opportunistic jobs below
        self.bad = [0] * n  # GPUs on unhealthy servers below
        self.busy = [0] * n  # GPUs held by guaranteed jobs below
        self.free_kids = [0] * n
        self.any_bad = False  # whether any server is bad (set by the ledger)
        self.sets: dict[ListKey, set[int]] = {}
        self.heaps: dict[ListKey, list[Entry]] = {}
        for top in tree.tops:
            self.add(top, POOL)

    def key(self, cell: int) -> Entry:
        return (1 if self.bad[cell] else 0, self.opp[cell], cell)

    def _list(self, cell: int, owner: str) -> ListKey:
        return (self.tree.chain[cell], self.tree.level[cell], owner)

    def add(self, cell: int, owner: str) -> None:
        """Put ``cell`` on its owner's free list (no merging)."""
        self.state[cell] = FREE
        self.owner[cell] = owner
        lk = self._list(cell, owner)
        self.sets.setdefault(lk, set()).add(cell)
        heapq.heappush(self.heaps.setdefault(lk, []), self.key(cell))
        parent = self.tree.parent[cell]
        if parent >= 0:
            self.free_kids[parent] += 1

    def remove(self, cell: int) -> None:
        """Take ``cell`` off its free list; the caller sets its new state."""
        self.sets[self._list(cell, self.owner[cell])].discard(cell)
        parent = self.tree.parent[cell]
        if parent >= 0:
            self.free_kids[parent] -= 1
        self.state[cell] = INNER

    def rekey(self, cell: int) -> None:
        """Record that ``cell``'s key changed (a stale entry stays behind)."""
        if self.state[cell] == FREE:
            lk = self._list(cell, self.owner[cell])
            heap = self.heaps[lk]
            heapq.heappush(heap, self.key(cell))
            if len(heap) > 2 * len(self.sets[lk]) + 64:
                self._compact(lk)

    def _compact(self, lk: ListKey) -> None:
        heap = [self.key(c) for c in self.sets[lk]]
        heapq.heapify(heap)
        self.heaps[lk] = heap

    def best(self, chain: GpuType, level: int, owner: str, healthy: bool = True) -> int | None:
        """The preferred free cell of a list, without taking it."""
        lk = (chain, level, owner)
        heap = self.heaps.get(lk)
        if not heap:
            return None
        members = self.sets[lk]
        while heap:
            entry = heap[0]
            cell = entry[2]
            if cell in members and self.key(cell) == entry:
                return None if healthy and entry[0] else cell
            heapq.heappop(heap)
        return None

    def take(self, chain: GpuType, level: int, owner: str) -> int | None:
        """ALLOCATECELL: a free level-``level`` cell of ``owner``, split from
        above when none is free; None when no healthy one can be had."""
        cell = self.best(chain, level, owner)
        if cell is None:
            if level >= self.tree.chains[chain].top:
                return None
            if self.any_bad:
                # A healthy part of a partly bad cell before a split of a
                # wholly healthy one: the latter is still whole at its level,
                # which a larger virtual cell may need (§4).
                part = self._take_healthy_part(chain, level, owner)
                if part is not None:
                    return part
            parent = self.take(chain, level + 1, owner)
            if parent is None:
                return None
            self.split(parent, owner)
            cell = self.best(chain, level, owner)
            if cell is None:  # cannot happen: a healthy parent has healthy children
                for kid in self.tree.children[parent]:
                    self.remove(kid)
                self.put(parent, owner)
                return None
        self.remove(cell)
        return cell

    def _take_healthy_part(self, chain: GpuType, level: int, owner: str) -> int | None:
        """A healthy level-``level`` cell inside a partly bad free cell: the
        lowest such level, then the lowest ids (§4: prefer healthy cells
        while any remain, and keep the wholly healthy ones whole)."""
        for above in range(level + 1, self.tree.chains[chain].top + 1):
            for cell in sorted(self.sets.get((chain, above, owner), ())):
                if not self.bad[cell]:
                    continue
                part = next((c for c in self.tree.below(cell, level) if not self.bad[c]), None)
                if part is not None:
                    self.carve(part, owner)
                    return part
        return None

    def split(self, cell: int, owner: str) -> None:
        self.state[cell] = SPLIT
        for kid in self.tree.children[cell]:
            self.add(kid, owner)

    def put(self, cell: int, owner: str, stop: int = -1) -> int:
        """RELEASECELL: free ``cell`` and merge it with its buddies while all
        are free with the same owner, not above ``stop``; returns the cell
        it ended in."""
        self.add(cell, owner)
        parent = self.tree.parent[cell]
        while cell != stop and parent >= 0 and self._mergeable(parent, owner):
            for kid in self.tree.children[parent]:
                self.remove(kid)
            self.add(parent, owner)
            cell, parent = parent, self.tree.parent[parent]
        return cell

    def _mergeable(self, parent: int, owner: str) -> bool:
        kids = self.tree.children[parent]
        if self.free_kids[parent] != len(kids) or self.state[parent] != SPLIT:
            return False
        return all(self.owner[k] == owner for k in kids)

    def carve(self, cell: int, owner: str) -> bool:
        """Take exactly ``cell`` from ``owner``'s free lists, splitting the
        free cell that holds it; False when no such free cell holds it."""
        path = []
        top = cell
        while top >= 0 and self.state[top] != FREE:
            if self.state[top] != INNER:
                return False
            path.append(top)
            top = self.tree.parent[top]
        if top < 0 or self.owner[top] != owner:
            return False
        path.append(top)
        for above in reversed(path[1:]):
            self.remove(above)
            self.split(above, owner)
        self.remove(cell)
        return True

    def free_cells(self) -> list[tuple[GpuType, int, str, int]]:
        """Every free cell as (chain, level, owner, id), sorted."""
        return sorted((lk[0], lk[1], lk[2], c) for lk, s in self.sets.items() for c in s)
