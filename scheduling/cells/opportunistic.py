"""Opportunistic (low-priority) placement (HiveD §3.3, "Allocating low-priority cells").

An opportunistic job runs on idle GPUs of any tenant's cells or of the
pool: a cell none of whose GPUs a guaranteed job holds, another
opportunistic job uses, or a bad server carries. Among those, cells that
lie in no bound cell come first ("farthest away from those occupied by
high-priority jobs"), then those whose nearest guaranteed job is
farthest up the tree, then the lowest id, which packs low-priority jobs
together. Unlike guaranteed binding this is a scan of the level's cells,
not O(levels): it runs once per opportunistic job, not per round.
"""

from __future__ import annotations

from scheduling.cells.binding import Bindings
from scheduling.cells.buddy import USED, Buddy
from scheduling.cells.tree import Tree
from shared.ids import GpuType


def _preference(tree: Tree, buddy: Buddy, bindings: Bindings, cell: int
                ) -> tuple[bool, int, int]:
    """Outside bound cells first, then farthest from guaranteed jobs: the
    lowest cell above holding a guaranteed GPU is as high as can be."""
    above = tree.ancestors(cell)
    near = next((tree.level[a] for a in above if buddy.busy[a]), len(above) + tree.level[cell])
    return (any(a in bindings.bound for a in above), -near, cell)


def idle(tree: Tree, buddy: Buddy, cell: int, bad_ok: bool = False) -> bool:
    """No GPU of ``cell`` is used, by a guaranteed job holding a cell above
    it or below it, or by an opportunistic job, or (unless ``bad_ok``) bad."""
    if buddy.busy[cell] or buddy.opp[cell] or (buddy.bad[cell] and not bad_ok):
        return False
    return all(buddy.state[a] != USED for a in tree.ancestors(cell))


def idle_cells(tree: Tree, buddy: Buddy, bindings: Bindings, chain: GpuType, level: int,
               count: int) -> list[int] | None:
    """``count`` wholly idle cells of a level, preferred first; None if fewer exist."""
    found = [c for c in tree.at_level.get((chain, level), []) if idle(tree, buddy, c)]
    if len(found) < count:
        return None
    found.sort(key=lambda c: _preference(tree, buddy, bindings, c))
    return found[:count]
