"""The cell specification: cell types, physical cells, virtual clusters.

The vocabulary is HiveD's (§3.2, §4 "Cell specification", Figure 4) with
Hops server ids: a cell type splits into ``child_cell_number`` cells of
``child_cell_type``; a chain ends in a GPU type (its level-1 cell), so there
is one chain per GPU type (§3.2 "Heterogeneity"). A node-level physical cell
names the Hops server it is; the cells below it are derived. A virtual
cluster reserves a number of cells of some types (§3.2, the table of
Figure 3). Validation turns every misuse into one :class:`SpecError` naming
the file and the field, and checks that the reservations are feasible, i.e.
that Theorem 1's invariant (2) holds before any allocation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from shared.cluster import Cluster
from shared.ids import GpuType, ServerId
from shared.specs import SpecError, convert, read_document


class CellTypeSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One cell type: the type of its children (a cell type or a GPU type)
    and how many, and whether a cell of this type is one server."""

    child_cell_type: str
    child_cell_number: int
    is_node_level: bool = False


class PhysicalCellSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A physical cell: above node level it lists its children; at node
    level it names its server and its children are derived."""

    cell_type: str | None = None
    server: ServerId | None = None
    children: tuple[PhysicalCellSpec, ...] = ()


class VirtualCellSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cell_type: str
    cell_number: int = 1


class VirtualClusterSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tenant's reservation; a low-priority tenant only runs
    opportunistically (§3.3 "Allocating low-priority cells"), and its weight
    is its share in the weighted max-min of opportunistic capacity."""

    virtual_cells: tuple[VirtualCellSpec, ...] = ()
    low_priority: bool = False
    weight: float = 1.0


class CellsFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cell_types: dict[str, CellTypeSpec]
    physical_cells: tuple[PhysicalCellSpec, ...]
    virtual_clusters: dict[str, VirtualClusterSpec] = msgspec.field(default_factory=dict)


class Chain(msgspec.Struct, frozen=True):
    """One homogeneous pool (§3.2 "Heterogeneity"): the cell type at each
    level (index 0 is level 1, the GPU type) and the GPUs of a cell there."""

    gpu_type: GpuType
    types: tuple[str, ...]
    sizes: tuple[int, ...]
    node_level: int

    @property
    def top(self) -> int:
        return len(self.types)

    def split(self, level: int) -> int:
        """h_k of Eqn. (1): how many level-(k-1) cells a level-k cell holds."""
        return self.sizes[level - 1] // self.sizes[level - 2]

    def level_for(self, gpus: int) -> int | None:
        """The smallest level whose cell holds ``gpus`` GPUs."""
        for level, size in enumerate(self.sizes, start=1):
            if size >= gpus:
                return level
        return None


class CellModel(msgspec.Struct, frozen=True):
    """A validated specification, resolved against a cluster."""

    chains: dict[GpuType, Chain]
    physical_cells: tuple[PhysicalCellSpec, ...]
    # tenant -> chain -> reserved cell count per level (index 0 is level 1)
    reservations: dict[str, dict[GpuType, tuple[int, ...]]]
    low_priority: dict[str, bool]
    weights: dict[str, float]
    type_level: dict[str, tuple[GpuType, int]]


def _fail(source: str, field: str, message: str) -> SpecError:
    return SpecError(f"{source}: {field}: {message}")


def _resolve_type(name: str, types: dict[str, CellTypeSpec], leaves: set[str],
                  source: str) -> list[str]:
    """The chain below ``name``, from the GPU type up to ``name``."""
    path = [name]
    while path[-1] not in leaves:
        spec = types.get(path[-1])
        if spec is None:
            raise _fail(source, f"cell_types.{path[-2]}.child_cell_type",
                        f"unknown cell type {path[-1]!r}")
        if spec.child_cell_number < 1:
            raise _fail(source, f"cell_types.{path[-1]}.child_cell_number",
                        f"must be >= 1, got {spec.child_cell_number}")
        if spec.child_cell_type in path:
            cycle = " -> ".join([*path[path.index(spec.child_cell_type):],
                                 spec.child_cell_type])
            raise _fail(source, f"cell_types.{path[-1]}.child_cell_type",
                        f"cyclic cell type: {cycle}")
        path.append(spec.child_cell_type)
    return path[::-1]


def _chains(file: CellsFile, cluster: Cluster, source: str
            ) -> tuple[dict[GpuType, Chain], dict[str, tuple[GpuType, int]]]:
    leaves = {str(t.name) for t in cluster.gpu_types}
    by_chain: dict[str, list[str]] = {}
    type_level: dict[str, tuple[GpuType, int]] = {}
    for name in sorted(file.cell_types):
        if name in leaves:
            raise _fail(source, f"cell_types.{name}", "a cell type may not be named as a GPU type")
        path = _resolve_type(name, file.cell_types, leaves, source)
        gpu = GpuType(path[0])
        known = by_chain.setdefault(gpu, [])
        for level, t in enumerate(path, start=1):
            if len(known) < level:
                known.append(t)
            elif known[level - 1] != t:
                raise _fail(source, f"cell_types.{t}",
                            f"chain {gpu} has two cell types at level {level}: "
                            f"{known[level - 1]} and {t}")
            type_level[t] = (gpu, level)
    chains: dict[GpuType, Chain] = {}
    for name_, types in sorted(by_chain.items()):
        gpu = GpuType(name_)
        sizes = [1]
        for t in types[1:]:
            sizes.append(sizes[-1] * file.cell_types[t].child_cell_number)
        nodes = [lv for lv, t in enumerate(types, start=1)
                 if t in file.cell_types and file.cell_types[t].is_node_level]
        if len(nodes) != 1:
            raise _fail(source, "cell_types",
                        f"chain {gpu} needs exactly one node-level cell type, has {len(nodes)}")
        chains[GpuType(gpu)] = Chain(GpuType(gpu), tuple(types), tuple(sizes), nodes[0])
    return chains, type_level


class _PhysicalCheck:
    """Walks the physical cells, checking servers against the cluster."""

    def __init__(self, file: CellsFile, cluster: Cluster, source: str,
                 type_level: dict[str, tuple[GpuType, int]],
                 chains: dict[GpuType, Chain]) -> None:
        self.file, self.cluster, self.source = file, cluster, source
        self.type_level, self.chains = type_level, chains
        self.used: dict[ServerId, str] = {}

    def top(self, cell: PhysicalCellSpec, field: str) -> None:
        if cell.cell_type is None:
            raise _fail(self.source, f"{field}.cell_type", "a top-level cell needs a cell_type")
        self.cell(cell, cell.cell_type, field)

    def cell(self, cell: PhysicalCellSpec, expected: str, field: str) -> None:
        if cell.cell_type is not None and cell.cell_type != expected:
            known = cell.cell_type in self.type_level
            what = "unknown cell type" if not known else f"expected {expected}, got"
            raise _fail(self.source, f"{field}.cell_type", f"{what} {cell.cell_type!r}")
        if expected not in self.type_level or expected not in self.file.cell_types:
            raise _fail(self.source, f"{field}.cell_type", f"unknown cell type {expected!r}")
        gpu, level = self.type_level[expected]
        chain = self.chains[gpu]
        if level > chain.node_level:
            self.above_node(cell, expected, field)
        elif level == chain.node_level:
            self.node(cell, chain, field)
        else:
            raise _fail(self.source, field,
                        f"a {expected} cell is below node level; name its node cell")

    def above_node(self, cell: PhysicalCellSpec, ctype: str, field: str) -> None:
        spec = self.file.cell_types[ctype]
        if cell.server is not None:
            raise _fail(self.source, f"{field}.server",
                        f"a {ctype} cell is above node level and names no server")
        if len(cell.children) != spec.child_cell_number:
            raise _fail(self.source, f"{field}.children",
                        f"a {ctype} cell has {spec.child_cell_number} children, "
                        f"{len(cell.children)} given")
        for i, child in enumerate(cell.children):
            self.cell(child, spec.child_cell_type, f"{field}.children[{i}]")

    def node(self, cell: PhysicalCellSpec, chain: Chain, field: str) -> None:
        if cell.children:
            raise _fail(self.source, f"{field}.children",
                        "a node-level cell's children are derived, not listed")
        if cell.server is None:
            raise _fail(self.source, f"{field}.server", "a node-level cell names its server")
        server = self.cluster.by_id.get(cell.server)
        if server is None:
            raise _fail(self.source, f"{field}.server", f"unknown server {cell.server!r}")
        if cell.server in self.used:
            raise _fail(self.source, f"{field}.server",
                        f"server {cell.server} is already used by {self.used[cell.server]}")
        self.used[cell.server] = field
        if server.gpu_type != chain.gpu_type:
            raise _fail(self.source, f"{field}.server",
                        f"server {cell.server} has {server.gpu_type} GPUs, "
                        f"a {chain.types[chain.node_level - 1]} cell has {chain.gpu_type}")
        leaves = chain.sizes[chain.node_level - 1]
        if server.gpus != leaves:
            raise _fail(self.source, f"{field}.server",
                        f"server {cell.server} has {server.gpus} GPUs, "
                        f"its cell has {leaves} leaf cells")


def _top_counts(file: CellsFile, chains: dict[GpuType, Chain],
                type_level: dict[str, tuple[GpuType, int]]) -> dict[GpuType, list[int]]:
    counts = {g: [0] * c.top for g, c in chains.items()}
    for cell in file.physical_cells:
        gpu, level = type_level[str(cell.cell_type)]
        counts[gpu][level - 1] += 1
    return counts


def shortfall(chain: Chain, free: list[int], need: list[int]) -> tuple[int, int, int] | None:
    """The highest level where invariant (2) fails, as (level, need, available);
    ``free`` is f_k and ``need`` is r_k - a_k, both indexed by level - 1.
    F_k follows Eqn. (1), from the top level down."""
    carried = 0
    for level in range(chain.top, 0, -1):
        available = free[level - 1] + carried
        if need[level - 1] > available:
            return level, need[level - 1], available
        if level > 1:
            carried = (available - need[level - 1]) * chain.split(level)
    return None


def _reservations(file: CellsFile, chains: dict[GpuType, Chain],
                  type_level: dict[str, tuple[GpuType, int]], source: str,
                  tops: dict[GpuType, list[int]]) -> dict[str, dict[GpuType, tuple[int, ...]]]:
    out: dict[str, dict[GpuType, tuple[int, ...]]] = {}
    total = {g: [0] * c.top for g, c in chains.items()}
    for tenant, vc in file.virtual_clusters.items():
        field = f"virtual_clusters.{tenant}"
        if vc.weight <= 0:
            raise _fail(source, f"{field}.weight", f"must be > 0, got {vc.weight}")
        if vc.low_priority and vc.virtual_cells:
            raise _fail(source, f"{field}.virtual_cells", "a low-priority tenant reserves no cells")
        mine = {g: [0] * c.top for g, c in chains.items()}
        for i, cell in enumerate(vc.virtual_cells):
            where = f"{field}.virtual_cells[{i}]"
            if cell.cell_type not in type_level:
                raise _fail(source, f"{where}.cell_type", f"unknown cell type {cell.cell_type!r}")
            if cell.cell_number < 1:
                raise _fail(source, f"{where}.cell_number", f"must be >= 1, got {cell.cell_number}")
            gpu, level = type_level[cell.cell_type]
            mine[gpu][level - 1] += cell.cell_number
            total[gpu][level - 1] += cell.cell_number
        for gpu in sorted(chains):
            short = shortfall(chains[gpu], tops[gpu], total[gpu])
            if short is not None:
                level, need, available = short
                raise _fail(source, field, f"tenant {tenant}: chain {gpu} level {level}: "
                            f"{need} needed, {available} available")
        out[tenant] = {g: tuple(v) for g, v in mine.items() if any(v)}
    return out


def cells_from_doc(doc: Any, cluster: Cluster, source: str = "cells") -> CellModel:
    """Validate a parsed document holding ``cell_types``, ``physical_cells``
    and ``virtual_clusters`` (other keys are left to their own readers, so
    the tenants file can carry these sections)."""
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: expected a mapping with cell_types and physical_cells")
    keys = ("cell_types", "physical_cells", "virtual_clusters")
    file = convert({k: v for k, v in doc.items() if k in keys}, CellsFile, source)
    chains, type_level = _chains(file, cluster, source)
    check = _PhysicalCheck(file, cluster, source, type_level, chains)
    for i, cell in enumerate(file.physical_cells):
        check.top(cell, f"physical_cells[{i}]")
    tops = _top_counts(file, chains, type_level)
    reservations = _reservations(file, chains, type_level, source, tops)
    return CellModel(
        chains=chains, physical_cells=file.physical_cells, reservations=reservations,
        low_priority={t: vc.low_priority for t, vc in file.virtual_clusters.items()},
        weights={t: vc.weight for t, vc in file.virtual_clusters.items()},
        type_level=type_level)


def load_cells(path: str | Path, cluster: Cluster) -> CellModel:
    """The cell specification in the file at ``path``, checked against ``cluster``."""
    p = Path(path)
    doc, _ = read_document(p)
    return cells_from_doc(doc, cluster, p.name)
