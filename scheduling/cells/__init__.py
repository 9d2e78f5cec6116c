"""HiveD's virtual clusters and buddy cell allocation (Zhao et al., OSDI'20).

The pure core of tenant guarantees: the cell spec (:mod:`.spec`), the
physical cell trees (:mod:`.tree`), Algorithm 1 (:mod:`.buddy`), virtual
clusters and dynamic binding (:mod:`.binding`), opportunistic placement
(:mod:`.opportunistic`) and the facade :class:`Cells` (:mod:`.algorithm`).
"""

from scheduling.cells.algorithm import Cells
from scheduling.cells.slots import virtual_slots
from scheduling.cells.spec import CellModel, cells_from_doc, load_cells
from scheduling.cells.views import (
    Allocation,
    BoundCell,
    ChainView,
    LevelCount,
    Refusal,
    ServerGpus,
    Snapshot,
    TenantView,
    Violation,
    VirtualSlot,
)

__all__ = [
    "Allocation", "BoundCell", "CellModel", "Cells", "ChainView", "LevelCount", "Refusal",
    "ServerGpus", "Snapshot", "TenantView", "Violation", "VirtualSlot", "cells_from_doc",
    "load_cells", "virtual_slots",
]
