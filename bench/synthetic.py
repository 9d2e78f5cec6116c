"""Synthetic clusters and queues for the planning benchmarks.

Servers have 8 GPUs and come in 3-5 GPU types in contiguous blocks; within a
type, every eighth server is an older server model whose GPUs run 12% slower
for every job (the entity-level difference of Hops §1, Figure 1a), so the
estimates carry per-server curves as the entity layer would produce them.
"""

from __future__ import annotations

import random

from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.snapshot import JobState

GPUS_PER_SERVER = 8
REQUIREMENTS = (1, 2, 4, 8, 16)
TYPE_SPEED = (1.0, 1.6, 2.3, 3.1, 4.0)
OLD_SERVER_SLOWDOWN = 0.88


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def make_cluster(rng: random.Random, gpus: int) -> Cluster:
    n_servers = gpus // GPUS_PER_SERVER
    n_types = min(rng.randint(3, 5), n_servers)
    types = tuple(GpuTypeSpec(GpuType(f"t{i}"), 1e10, 1e9) for i in range(n_types))
    cuts = sorted(rng.sample(range(1, n_servers), n_types - 1))
    bounds = [0, *cuts, n_servers]
    servers = tuple(
        Server(
            ServerId(f"s{idx:04d}"),
            types[t].name,
            GPUS_PER_SERVER,
            model="old" if idx % 8 == 7 else "new",
        )
        for t in range(n_types)
        for idx in range(bounds[t], bounds[t + 1])
    )
    return Cluster(types, servers, name=f"bench-{gpus}")


def curve(rng: random.Random, per_gpu: float, rho: float, scale: float = 1.0) -> ThroughputCurve:
    eff = rng.uniform(0.85, 0.99)
    agg = tuple(_round(scale * per_gpu * eff ** (k - 1).bit_length()) for k in range(1, 9))
    decay = rng.uniform(0.9, 0.99)
    dist = tuple(_round(scale * per_gpu / rho * decay ** (n - 2)) for n in range(2, 9))
    return ThroughputCurve(agg, dist)


def make_estimate(rng: random.Random, cluster: Cluster, jid: JobId) -> JobEstimate:
    base, rho = rng.uniform(50, 500), rng.uniform(1.0, 3.0)
    by_type: dict[GpuType, ThroughputCurve] = {}
    by_server: dict[ServerId, ThroughputCurve] = {}
    for t, speed in zip(cluster.gpu_types, TYPE_SPEED, strict=False):
        seed = rng.random()
        tput, r = base * speed * rng.uniform(0.8, 1.2), rho * rng.uniform(0.9, 1.1)
        by_type[t.name] = curve(random.Random(seed), tput, r)
        old = curve(random.Random(seed), tput, r, OLD_SERVER_SLOWDOWN)
        by_server.update(
            {s.id: old for s in cluster.servers_of_type(t.name) if s.model == "old"}
        )
    return JobEstimate(jid, by_type, by_server)


def make_queue(
    rng: random.Random, cluster: Cluster, depth: float = 2.0
) -> tuple[list[JobState], dict[JobId, JobEstimate]]:
    """Jobs until their minimum requirements add up to ``depth`` x the cluster,
    so the service window, not the queue, bounds the pass."""
    jobs: list[JobState] = []
    estimates: dict[JobId, JobEstimate] = {}
    acc = 0
    while acc < depth * cluster.total_gpus:
        jid = JobId(f"j{len(jobs):05d}")
        reqs = tuple(sorted(rng.sample(REQUIREMENTS, rng.choice((1, 1, 2, 2, 3, 4)))))
        spec = JobSpec(
            id=jid, model="synthetic", batch_size=32, params=rng.randint(10**6, 4 * 10**8),
            total_samples=rng.randint(10**5, 10**8), requirements=reqs,
            submit_time=rng.uniform(0, 3600),
        )
        jobs.append(JobState(spec=spec, phase="queued", wait_s=rng.uniform(0, 7200)))
        estimates[jid] = make_estimate(rng, cluster, jid)
        acc += reqs[0]
    return jobs, estimates
