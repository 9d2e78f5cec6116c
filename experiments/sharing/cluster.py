"""The sharing experiment's rules (docs/tenancy.md, "Rules"; HiveD §3.2, §5.2).

Pure derivations from a :class:`~experiments.sharing.workload.TenantWorkload`:
each tenant's quota in node-level cells from its demand, the cluster of
exactly those cells (HiveD's feasibility with nothing to spare), and the
cells document in HiveD's vocabulary (``scheduling.cells.cells_from_doc``)
that feeds ``hived``, ``quota``/``quota-borrow`` and ``private`` alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from experiments.sharing.workload import TenantDemand
from shared.cluster import Cluster, Server
from shared.ids import GpuType, ServerId

# The paper's four levels (§5.1): GPU, PCIe switch (2), CPU socket (4), node (8).
LEVELS: tuple[tuple[str, int], ...] = (("SWITCH", 2), ("SOCKET", 2), ("NODE", 2))
NODE_GPUS = 8


def quota_cells(demand: TenantDemand, period_s: float, node_gpus: int = NODE_GPUS) -> int:
    """Rule 4: ``max(ceil(demand / node), ceil(largest job / node))`` node-level
    cells, demand being the time average of ``num_gpu x duration`` over the
    period (rule 3)."""
    if period_s <= 0:
        raise ValueError(f"period must be positive, got {period_s}")
    average = demand.gpu_seconds / period_s
    return max(math.ceil(average / node_gpus), math.ceil(demand.max_gpus / node_gpus), 1)


def quotas(demands: Sequence[TenantDemand], period_s: float,
           node_gpus: int = NODE_GPUS) -> dict[str, int]:
    return {d.tenant: quota_cells(d, period_s, node_gpus) for d in demands}


def server_ids(quota: Mapping[str, int]) -> dict[str, tuple[ServerId, ...]]:
    """Rule 5: one server per cell, numbered in tenant order (the numbering
    binds nothing: HiveD binds virtual cells dynamically)."""
    out: dict[str, tuple[ServerId, ...]] = {}
    k = 0
    for tenant, cells in quota.items():
        out[tenant] = tuple(ServerId(f"node-{k + i:03d}") for i in range(cells))
        k += cells
    return out


def sharing_cluster(template: Cluster, gpu: GpuType, servers: Sequence[ServerId],
                    name: str) -> Cluster:
    """A cluster of ``servers``, each a copy of ``template``'s first server of
    type ``gpu`` (rule 2: the traces' reference type), with that type's spec."""
    model = next(s for s in template.servers if s.gpu_type == gpu)
    spec = next(t for t in template.gpu_types if t.name == gpu)
    copies = tuple(msgspec.structs.replace(model, id=sid) for sid in servers)
    return Cluster(gpu_types=(spec,), servers=copies, name=name)


def cells_doc(gpu: GpuType, quota: Mapping[str, int],
              servers: Sequence[ServerId]) -> dict[str, Any]:
    """Rule 6: the cells document: the chain of ``gpu`` with the paper's four
    levels, one node-level physical cell per server, and per tenant a virtual
    cluster of its node-level cells."""
    types: dict[str, Any] = {}
    child = str(gpu)
    for suffix, n in LEVELS:
        name = f"{gpu}-{suffix}"
        types[name] = {"child_cell_type": child, "child_cell_number": n}
        child = name
    types[child]["is_node_level"] = True
    return {
        "cell_types": types,
        "physical_cells": [{"cell_type": child, "server": str(s)} for s in servers],
        "virtual_clusters": {
            t: {"virtual_cells": [{"cell_type": child, "cell_number": n}]}
            for t, n in quota.items()
        },
    }


def node_cell_type(gpu: GpuType) -> str:
    return f"{gpu}-{LEVELS[-1][0]}"


def cluster_doc(cluster: Cluster) -> dict[str, Any]:
    """The cluster spec document (shared.specs) of a cluster built here."""
    servers: list[dict[str, Any]] = []
    for s in cluster.servers:
        doc = msgspec.to_builtins(s)
        servers.append({k: v for k, v in doc.items() if v not in ("", 0) or k == "gpus"})
    return {"name": cluster.name, "gpu_types": msgspec.to_builtins(list(cluster.gpu_types)),
            "servers": servers}


def busy_nodes(servers: Sequence[Server], used: Mapping[ServerId, int]) -> int:
    """§5.2's fragmentation count: node cells that cannot host a node-sized
    job now, i.e. that have any GPU in use."""
    return sum(1 for s in servers if used.get(s.id, 0) > 0)
