"""The physical cells: one tree per top-level cell, numbered depth first.

A cell's id is its position in a depth-first walk of the top-level cells in
spec order, so buddy cells have neighbouring ids and choosing the lowest id
packs allocations (§3.3: keep as many higher-level cells available as
possible). Levels count from 1, the GPU, upward (§3.2). The tree never
changes; the allocation state lives in :mod:`scheduling.cells.buddy`.
"""

from __future__ import annotations

from bisect import bisect_left

from scheduling.cells.spec import CellModel, Chain, PhysicalCellSpec
from shared.ids import GpuType, ServerId


class Tree:
    """The immutable cell structure, as parallel lists indexed by cell id."""

    def __init__(self, model: CellModel) -> None:
        self.chains: dict[GpuType, Chain] = model.chains
        self.level: list[int] = []
        self.chain: list[GpuType] = []
        self.parent: list[int] = []
        self.children: list[tuple[int, ...]] = []
        self.server: list[ServerId | None] = []
        self.address: list[str] = []
        self.leaves: list[tuple[int, ...]] = []  # leaf cell ids below, in order
        self.gpu_index: list[int] = []  # a leaf's GPU index on its server, else -1
        self.end: list[int] = []  # one past the last id of the cell's subtree
        self.tops: list[int] = []
        self.node_of: dict[ServerId, int] = {}
        self.at_level: dict[tuple[GpuType, int], list[int]] = {}
        for i, top in enumerate(model.physical_cells):
            gpu, level = model.type_level[str(top.cell_type)]
            self.tops.append(self._build(top, self.chains[gpu], level, -1, f"{gpu}:{i}"))
        self.by_address = {a: c for c, a in enumerate(self.address)}

    def __len__(self) -> int:
        return len(self.level)

    def size(self, cell: int) -> int:
        return self.chains[self.chain[cell]].sizes[self.level[cell] - 1]

    def _new(self, chain: Chain, level: int, parent: int, address: str,
             server: ServerId | None, gpu: int) -> int:
        cell = len(self.level)
        self.level.append(level)
        self.chain.append(chain.gpu_type)
        self.parent.append(parent)
        self.children.append(())
        self.server.append(server)
        self.address.append(address)
        self.leaves.append(())
        self.gpu_index.append(gpu)
        self.end.append(cell + 1)
        self.at_level.setdefault((chain.gpu_type, level), []).append(cell)
        return cell

    def _build(self, spec: PhysicalCellSpec, chain: Chain, level: int, parent: int,
               address: str) -> int:
        cell = self._new(chain, level, parent, address, spec.server, -1)
        if level > chain.node_level:
            kids = [self._build(child, chain, level - 1, cell, f"{address}.{i}")
                    for i, child in enumerate(spec.children)]
        else:
            assert spec.server is not None  # checked by the spec
            self.node_of[spec.server] = cell
            kids = self._derive(chain, level, cell, address, spec.server, 0)
        self.children[cell] = tuple(kids)
        self.leaves[cell] = tuple(leaf for k in kids for leaf in self.leaves[k]) or (cell,)
        self.end[cell] = len(self.level)
        return cell

    def _derive(self, chain: Chain, level: int, cell: int, address: str, server: ServerId,
                first_gpu: int) -> list[int]:
        """The cells below a node-level cell, all on its server."""
        if level == 1:
            self.gpu_index[cell] = first_gpu
            return []
        kids = []
        below = chain.sizes[level - 2]
        for i in range(chain.split(level)):
            kid = self._new(chain, level - 1, cell, f"{address}.{i}", server, -1)
            grand = self._derive(chain, level - 1, kid, f"{address}.{i}", server,
                                 first_gpu + i * below)
            self.children[kid] = tuple(grand)
            self.leaves[kid] = tuple(leaf for g in grand for leaf in self.leaves[g]) or (kid,)
            self.end[kid] = len(self.level)
            kids.append(kid)
        return kids

    def below(self, cell: int, level: int) -> list[int]:
        """The cells of ``level`` in ``cell``'s subtree, in id order."""
        cells = self.at_level.get((self.chain[cell], level), [])
        return cells[bisect_left(cells, cell):bisect_left(cells, self.end[cell])]

    def ancestors(self, cell: int) -> list[int]:
        """``cell`` and every cell above it."""
        out = []
        while cell >= 0:
            out.append(cell)
            cell = self.parent[cell]
        return out
