"""The JCT floor of a workload: what each job would take alone on the
cluster, on its best resources.

A job's floor is ``total_samples / best`` where ``best`` is the highest true
throughput (:meth:`world.truth.GroundTruth.throughput`) over every GPU count
of its requirement set and every GPU type that runs the model and has at
least that many GPUs, each count placed as packed as the cluster allows:

* on one server when some server of the type has enough GPUs, every such
  server tried (servers of one type differ, e.g. the older RTX3090 hosts);
* else over the fewest servers, filled in turn, with the servers taken in
  two orders: largest first, and fastest first (one GPU's throughput of the
  model on the server) with the largest first among equals.

It leaves out everything a schedule adds: waiting in the queue, rounds
(starts at a round boundary), profiling, restarts and their cost, and
sharing the cluster with other jobs; it also leaves out placements spread
wider than needed (which the ground truth makes slower). A CPU job's floor is
its work at the cores it asked for (``total_samples / cores``). A job none of
whose counts fits a type that runs it has no floor (it is left out).

Pure: a function of the jobs, the ground truth and the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.cluster import Cluster, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from simulator.workloads import SimJob
from world.truth import GroundTruth


def filled(servers: Sequence[Server], gpus: int) -> Configuration | None:
    """``gpus`` GPUs filling ``servers`` in turn; None if they have too few."""
    parts: dict[ServerId, int] = {}
    left = gpus
    for server in servers:
        if left <= 0:
            break
        parts[server.id] = min(server.gpus, left)
        left -= parts[server.id]
    return Configuration.of(parts) if left <= 0 else None


def packed_placements(cluster: Cluster, truth: GroundTruth, model: str, gpu: GpuType,
                      gpus: int) -> list[Configuration]:
    """The packed placements of ``gpus`` GPUs of type ``gpu`` the floor tries."""
    servers = list(cluster.servers_of_type(gpu))
    if sum(s.gpus for s in servers) < gpus:
        return []
    single = [Configuration.of({s.id: gpus}) for s in servers if s.gpus >= gpus]
    if single:
        return single
    index = cluster.server_index
    speed = {s.id: truth.throughput(model, Configuration.of({s.id: 1})) for s in servers}
    orders = (
        sorted(servers, key=lambda s: (-s.gpus, index[s.id])),
        sorted(servers, key=lambda s: (-speed[s.id], -s.gpus, index[s.id])),
    )
    return [c for order in orders if (c := filled(order, gpus)) is not None]


def best_throughput(cluster: Cluster, truth: GroundTruth, model: str, gpus: int) -> float:
    """The highest true throughput of ``model`` on ``gpus`` GPUs of any type
    that runs it, packed (:func:`packed_placements`); 0 if none fits."""
    return max((truth.throughput(model, config)
                for t in cluster.gpu_types if truth.supports(model, t.name)
                for config in packed_placements(cluster, truth, model, t.name, gpus)),
               default=0.0)


def counts(job: SimJob) -> tuple[int, ...]:
    """The GPU counts a job may run with: its requirement set, or every count
    within its bounds (whatever R_num a policy turns them into)."""
    spec = job.spec
    if spec.requirements or spec.min_gpus is None or spec.max_gpus is None:
        return spec.requirement_set()
    return tuple(range(spec.min_gpus, spec.max_gpus + 1))


def floor(jobs: Sequence[SimJob], truth: GroundTruth, cluster: Cluster) -> dict[JobId, float]:
    """Each job's floor in seconds (see the module's docstring)."""
    cache: dict[tuple[str, int], float] = {}
    out: dict[JobId, float] = {}
    for job in jobs:
        spec = job.spec
        if spec.kind == "cpu":
            out[spec.id] = spec.total_samples / spec.cores
            continue
        best = 0.0
        for n in counts(job):
            if (job.model, n) not in cache:
                cache[(job.model, n)] = best_throughput(cluster, truth, job.model, n)
            best = max(best, cache[(job.model, n)])
        if best > 0:
            out[spec.id] = spec.total_samples / best
    return out
