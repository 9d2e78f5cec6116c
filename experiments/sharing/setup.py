"""The derived sharing experiment (docs/tenancy.md, rules 1-6): from the
traces, the workload over the shared period, the reference GPU type, the
tenants' quotas, the cluster of exactly the quotas' cells and its cells doc.
Run (:mod:`experiments.sharing.run`) and report
(:mod:`experiments.sharing.report`) both read it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from experiments.sharing.cluster import cells_doc, quotas, server_ids, sharing_cluster
from experiments.sharing.workload import TenantWorkload, read_tenant_traces
from shared.cluster import Cluster
from shared.ids import GpuType
from simulator.workloads import ELASTICFLOW_MODELS, _trace_reference, packaged_trace
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

TEMPLATE_CLUSTER = "paper-sim-512"


class Setup(msgspec.Struct, frozen=True):
    """The derived experiment: rule 1-6 applied to a workload."""

    workload: TenantWorkload
    gpu: GpuType
    quota: dict[str, int]
    servers: dict[str, tuple[str, ...]]
    cluster: Cluster
    cells: dict[str, Any]


def trace_paths(traces: Sequence[str]) -> list[Path]:
    return [packaged_trace(t) or Path(t) for t in traces]


def derive(traces: Sequence[str]) -> Setup:
    """Rules 1-6: workload over the shared period, reference GPU type,
    quotas, the cluster of exactly the quotas' cells and its cells doc."""
    workload = read_tenant_traces(trace_paths(traces))
    template = builtin_cluster(TEMPLATE_CLUSTER)
    truth = GroundTruth(template, builtin_catalog())
    models = sorted({pair[0] for pair in ELASTICFLOW_MODELS.values()})
    gpu = _trace_reference(template, truth, models)
    quota = quotas(workload.demands, workload.period_s)
    servers = server_ids(quota)
    every = [s for t in quota for s in servers[t]]
    cluster = sharing_cluster(template, gpu, every, "sharing")
    doc = cells_doc(gpu, quota, every)
    return Setup(workload, gpu, quota, {t: tuple(map(str, s)) for t, s in servers.items()},
                 cluster, doc)
