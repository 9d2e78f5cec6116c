"""Cell specs and clusters for the cell tests (HiveD §3.2, Figure 3)."""

from __future__ import annotations

from typing import Any

from scheduling.cells import Cells, cells_from_doc
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, ServerId


def cluster(servers: dict[str, tuple[str, int]]) -> Cluster:
    """Servers named by id with (GPU type, GPUs)."""
    types = sorted({t for t, _ in servers.values()})
    return Cluster(
        gpu_types=tuple(GpuTypeSpec(GpuType(t), 1e9, 1e8) for t in types),
        servers=tuple(Server(ServerId(s), GpuType(t), n) for s, (t, n) in servers.items()))


def figure3_doc() -> dict[str, Any]:
    """Figure 3: one rack of four 8-GPU nodes, levels GPU (1), PCIe switch
    (2), CPU socket (4) and node (8); tenants A and B reserve one level-3,
    one level-2 and one level-1 cell, tenant C two level-4 and one level-2."""
    return {
        "cell_types": {
            "K80-SWITCH": {"child_cell_type": "K80", "child_cell_number": 2},
            "K80-SOCKET": {"child_cell_type": "K80-SWITCH", "child_cell_number": 2},
            "K80-NODE": {"child_cell_type": "K80-SOCKET", "child_cell_number": 2,
                         "is_node_level": True},
        },
        "physical_cells": [{"cell_type": "K80-NODE", "server": f"n{i}"} for i in range(4)],
        "virtual_clusters": {
            "A": {"virtual_cells": [{"cell_type": "K80-SOCKET"}, {"cell_type": "K80-SWITCH"},
                                    {"cell_type": "K80"}]},
            "B": {"virtual_cells": [{"cell_type": "K80-SOCKET"}, {"cell_type": "K80-SWITCH"},
                                    {"cell_type": "K80"}]},
            "C": {"virtual_cells": [{"cell_type": "K80-NODE", "cell_number": 2},
                                    {"cell_type": "K80-SWITCH"}]},
        },
    }


def figure3_cluster() -> Cluster:
    return cluster({f"n{i}": ("K80", 8) for i in range(4)})


def figure3() -> Cells:
    return Cells(cells_from_doc(figure3_doc(), figure3_cluster(), "fig3.yaml"))
