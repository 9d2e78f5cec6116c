"""Two- and three-tenant clusters, cells and workloads for the HiveD layer
tests (HiveD §3.2, Figure 3 vocabulary)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduling.cells import CellModel, cells_from_doc
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from simulator.workloads import SimJob

RTX = GpuType("RTX3090")
MODEL = "resnet18-cifar10"


def rtx_cluster(nodes: int, gpus: int = 8) -> Cluster:
    spec = GpuTypeSpec(RTX, link_bandwidth=2.5e9, net_bandwidth=1e9)
    return Cluster(gpu_types=(spec,), servers=tuple(
        Server(ServerId(f"n{i}"), RTX, gpus, model="TIGERWAY YK8100-8G") for i in range(nodes)))


def cells_doc(reservations: dict[str, list[tuple[str, int]]], nodes: int,
              low: Sequence[str] = (), weights: dict[str, float] | None = None,
              gpus: int = 8) -> dict[str, Any]:
    """A chain GPU (1) -> PAIR (2) -> QUAD (4) -> NODE (8) over ``nodes`` servers."""
    types: dict[str, Any] = {
        "PAIR": {"child_cell_type": str(RTX), "child_cell_number": 2},
        "QUAD": {"child_cell_type": "PAIR", "child_cell_number": 2},
        "NODE": {"child_cell_type": "QUAD", "child_cell_number": gpus // 4,
                 "is_node_level": True},
    }
    vcs: dict[str, Any] = {
        t: {"virtual_cells": [{"cell_type": c, "cell_number": n} for c, n in cells],
            "weight": (weights or {}).get(t, 1.0)}
        for t, cells in reservations.items()}
    for t in low:
        vcs[t] = {"low_priority": True, "weight": (weights or {}).get(t, 1.0)}
    return {"cell_types": types,
            "physical_cells": [{"cell_type": "NODE", "server": f"n{i}"} for i in range(nodes)],
            "virtual_clusters": vcs}


def model_of(cluster: Cluster, reservations: dict[str, list[tuple[str, int]]],
             **kw: Any) -> CellModel:
    return cells_from_doc(cells_doc(reservations, len(cluster.servers), **kw), cluster, "t.yaml")


def job(job_id: str, tenant: str, gpus: Sequence[int], at: float = 0.0,
        samples: int = 200_000) -> SimJob:
    spec = JobSpec(JobId(job_id), MODEL, 256, 11_181_642, samples, tenant=TenantId(tenant),
                   requirements=tuple(gpus), submit_time=at)
    return SimJob(spec=spec, model=MODEL)
