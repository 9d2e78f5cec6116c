"""Two- and three-tenant clusters, cells and workloads for the HiveD layer
tests (HiveD §3.2, Figure 3 vocabulary)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduling.cells import CellModel, cells_from_doc
from scheduling.layers.base import stack
from scheduling.policy import Policy
from scheduling.registry import make_policy
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.snapshot import LayerRecord, Plan, Snapshot
from simulator.engine import Simulation
from simulator.metrics import SimResult
from simulator.settings import SimSettings
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.truth import GroundTruth

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


class Spy:
    """The outermost layer of a test: records every snapshot and plan."""

    name = "spy"

    def __init__(self) -> None:
        self.calls: list[tuple[Snapshot, Plan]] = []

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan = inner.plan(snapshot)
        self.calls.append((snapshot, plan))
        return plan


def simulate(cluster: Cluster, jobs: Sequence[SimJob], spec: str, model: CellModel,
             max_time_s: float = 6 * 3600.0) -> tuple[SimResult, Spy]:
    """A run of a tenant policy, every plan recorded."""
    spy = Spy()
    policy = stack(make_policy(spec, cells=model), spy)
    settings = SimSettings(max_time_s=max_time_s)
    result = Simulation(cluster, jobs, policy, GroundTruth(cluster, builtin_catalog()),
                        settings).run()
    return result, spy


def record(plan: Plan, name: str) -> LayerRecord:
    return next(r for r in plan.reasons.layers if r.name == name)


def config_of(spy: Spy, job_id: str) -> tuple[Snapshot, Configuration] | None:
    """The first plan that started ``job_id``, and its configuration."""
    for snap, plan in spy.calls:
        config = plan.config_of(JobId(job_id))
        if config is not None:
            return snap, config
    return None
