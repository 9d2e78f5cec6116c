"""Throughput estimates as the planner consumes them.

The estimator (``services.estimator``) answers, per job, a :class:`JobEstimate`:
per-GPU throughput curves for every GPU type, plus per-server curves where the
server-entity layer knows better (§3.3). The planner turns them into
configuration throughputs (§3.5), sensitivity (Eq. 10) and age (Eq. 9) with the
pure functions below, so the live scheduler and the simulator compute these
numbers the same way.
"""

from __future__ import annotations

import msgspec

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId


class ThroughputCurve(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-GPU throughput (samples/s) of one job on one type or server.

    ``agg[k-1]`` is the per-GPU throughput with ``k`` GPUs on one server
    (aggregated table); ``dist[n-2]`` the per-GPU throughput of this server's
    GPUs in a placement over ``n >= 2`` nodes (distributed table).
    """

    agg: tuple[float, ...]
    dist: tuple[float, ...] = ()

    def agg_per_gpu(self, gpus: int) -> float:
        if gpus <= 0:
            raise ValueError("gpus must be > 0")
        if gpus > len(self.agg):
            return self.agg[-1] if self.agg else 0.0
        return self.agg[gpus - 1]

    def dist_per_gpu(self, nodes: int) -> float:
        if nodes < 2:
            raise ValueError("a distributed placement has at least two nodes")
        if not self.dist:
            return 0.0
        return self.dist[min(nodes, len(self.dist) + 1) - 2]


class JobEstimate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything the planner needs to know about one job's speed."""

    job_id: JobId
    by_type: dict[GpuType, ThroughputCurve]
    by_server: dict[ServerId, ThroughputCurve] = {}

    def curve(self, cluster: Cluster, server: ServerId) -> ThroughputCurve:
        own = self.by_server.get(server)
        if own is not None:
            return own
        return self.by_type[cluster.by_id[server].gpu_type]

    def per_gpu(self, cluster: Cluster, server: ServerId, local_gpus: int, nodes: int) -> float:
        curve = self.curve(cluster, server)
        return curve.agg_per_gpu(local_gpus) if nodes == 1 else curve.dist_per_gpu(nodes)


def config_throughput(est: JobEstimate, cluster: Cluster, config: Configuration) -> float:
    """§3.5: the slowest server's per-GPU throughput times the total GPUs."""
    nodes = config.num_nodes
    slowest = min(est.per_gpu(cluster, s, g, nodes) for s, g in config.parts)
    return slowest * config.total_gpus


def sensitivity(est: JobEstimate, gpu_type: GpuType) -> float:
    """Eq. (10): rho = throughput{0:1} / per-GPU throughput{0:1, 1:1} on one type."""
    curve = est.by_type[gpu_type]
    agg = curve.agg_per_gpu(1)
    dist = curve.dist_per_gpu(2)
    if dist <= 0:
        return float("inf")
    return agg / dist


def job_sensitivity(est: JobEstimate, cluster: Cluster) -> float:
    """One rho per job for queue-level decisions (the sensitivity adjustment):
    the per-type values of Eq. (10) weighted by each type's GPU share."""
    share = cluster.type_share()
    return sum(p * sensitivity(est, t) for t, p in share.items() if t in est.by_type)


def age(est: JobEstimate, cluster: Cluster, total_samples: float, r_avg: float) -> float:
    """Eq. (9): expected run time without waiting, in seconds.

    age = sum_j P(type=j) * total_samples / (throughput_ij * R_avg), where
    throughput_ij is the job's single-GPU throughput on type j.
    """
    # Types the job cannot run on (no throughput) are left out and the
    # probabilities renormalised over the rest.
    terms: list[tuple[float, float]] = []
    for gpu_type, p in cluster.type_share().items():
        curve = est.by_type.get(gpu_type)
        tput = curve.agg_per_gpu(1) if curve else 0.0
        if p > 0 and tput > 0:
            terms.append((p, total_samples / (tput * r_avg)))
    mass = sum(p for p, _ in terms)
    if mass <= 0:
        return float("inf")
    return sum(p * t for p, t in terms) / mass
