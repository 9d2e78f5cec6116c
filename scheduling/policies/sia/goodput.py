"""Sia's normalised goodput matrix (Sia §3.3) as the Hops paper configures
it (§4.2): a job's row of ``(type, GPUs, nodes, G)``, one entry per
requirement R_k, the restart factor of Sia Eq. (2), and a running job's
current allocation as Sia sees it (type and GPU count). :mod:`.policy`
turns them into the ILP's columns."""

from __future__ import annotations

from collections.abc import Sequence

from shared.cluster import Cluster
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType
from shared.snapshot import JobState


def type_goodput(curve: ThroughputCurve, gpus: int, per_node: int) -> tuple[int, float]:
    """Nodes and goodput of ``gpus`` GPUs of one type: the aggregated curve
    when they fit one node, else the distributed one over ceil(gpus / node)."""
    nodes = -(-gpus // per_node)
    per_gpu = curve.agg_per_gpu(gpus) if nodes == 1 else curve.dist_per_gpu(nodes)
    return nodes, per_gpu * gpus


def job_row(
    cluster: Cluster, est: JobEstimate, requirements: Sequence[int], scale_to_min: bool
) -> list[tuple[GpuType, int, int, float]]:
    """The job's row of Sia's normalised goodput matrix: ``(type, gpus, nodes,
    G)`` for every requirement that some type has enough GPUs for, whether or
    not they are free now, so that G does not depend on the round's load."""
    row: list[tuple[GpuType, int, int, float]] = []
    for spec in cluster.gpu_types:
        curve = est.by_type.get(spec.name)
        per_node = cluster.max_server_gpus(spec.name)
        if curve is None or per_node == 0:
            continue
        total = cluster.type_gpus(spec.name)
        for gpus in requirements:
            if gpus > total:
                continue
            nodes, goodput = type_goodput(curve, gpus, per_node)
            if goodput > 0:
                row.append((spec.name, gpus, nodes, goodput))
    low = min((g for *_, g in row), default=0.0)
    scale = (min(requirements) if scale_to_min else 1.0) / low if low > 0 else 0.0
    return [(t, gpus, nodes, g * scale) for t, gpus, nodes, g in row]


def restart_factor(job: JobState, now: float, penalty_s: float) -> float:
    """Sia Eq. (2): r = max(T - N * S, 0) / (T + S), T the job's age, N its
    restarts, S the seconds a restart costs; 1 while T < S, as in the
    artifact's ``optimize_mip``, so a young job is not held in place."""
    age = max(0.0, now - job.spec.submit_time)
    if penalty_s <= 0 or age < penalty_s:
        return 1.0
    return max(age - job.restarts * penalty_s, 0.0) / (age + penalty_s)


def current_allocation(cluster: Cluster, job: JobState) -> tuple[GpuType, int] | None:
    """The job's current allocation as Sia sees it: (type, GPU count)."""
    if job.current is None:
        return None
    servers = [cluster.by_id.get(sid) for sid in job.current.servers]
    types = {s.gpu_type for s in servers if s is not None}
    if None in servers:
        return None  # a server that left the cluster: nothing to keep
    return (types.pop(), job.current.total_gpus) if len(types) == 1 else None
