"""Offered load of a workload, and the arrival compression that sets it
(issue 22: real traces run with queues forming, "offered load about
1.2-1.5x the 512-GPU cluster, by a rule stated before looking at results").

The rule, fixed before any compressed run: the first N jobs of a trace keep
their order and relative gaps; their submit times are divided by the one
factor that makes the offered load :data:`TARGET` (1.35, the middle of the
band) times the cluster's GPUs, or left as they are when it is higher
already. Offered load is the GPU-seconds the jobs ask for, each at its
smallest requirement on the reference type packed as tightly as the cluster
allows (what a rigid trace states: ``num_gpu`` x ``duration``), over the
span from the first submission to the last.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.cluster import Cluster
from shared.ids import GpuType
from simulator.workloads import SimJob, packed
from world.truth import GroundTruth

TARGET = 1.35


def demand_gpu_s(jobs: Sequence[SimJob], truth: GroundTruth, cluster: Cluster,
                 reference: GpuType) -> float:
    """GPU-seconds of the jobs at their smallest requirement on ``reference``."""
    total = 0.0
    rates: dict[tuple[str, int], float] = {}
    top = cluster.type_gpus(reference)
    for j in jobs:
        gpus = min(min(j.spec.requirement_set()), top)
        key = (j.model, gpus)
        if key not in rates:
            rates[key] = truth.throughput(j.model, packed(cluster, reference, gpus))
        if rates[key] > 0:
            total += gpus * j.spec.total_samples / rates[key]
    return total


def offered_load(jobs: Sequence[SimJob], truth: GroundTruth, cluster: Cluster,
                 reference: GpuType) -> float:
    """Demand over the arrival span, in units of the cluster's GPUs."""
    times = [j.spec.submit_time for j in jobs]
    span = max(times, default=0.0) - min(times, default=0.0)
    if span <= 0 or cluster.total_gpus <= 0:
        return float("inf")
    return demand_gpu_s(jobs, truth, cluster, reference) / span / cluster.total_gpus


def compression(jobs: Sequence[SimJob], truth: GroundTruth, cluster: Cluster,
                reference: GpuType, target: float = TARGET) -> float:
    """The factor submit times are divided by to offer ``target`` (>= 1)."""
    load = offered_load(jobs, truth, cluster, reference)
    return max(1.0, target / load) if load > 0 else 1.0
