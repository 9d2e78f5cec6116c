"""CPU cores in the simulation (CODA, issue 21): the speeds of running jobs
at the cores they hold (:mod:`world.cores`) under memory-bandwidth
contention (:mod:`simulator.contention`), and CODA's first kind of
fragmentation."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import ServerId
from shared.resources import NOTHING, Resources
from simulator.contention import server_demand, slowdown
from simulator.state import JobRecord
from world.cores import core_factor, speed
from world.truth import GroundTruth


def gpus_short_of_cores(cluster: Cluster, used_gpus: Mapping[ServerId, int],
                        extras: Mapping[ServerId, Resources]) -> int:
    """Idle GPUs that have no free core beside them: on each server, the
    idle GPUs beyond its free cores (one core per GPU, the least any GPU job
    needs). CODA's first kind of fragmentation (§VI-C)."""
    short = 0
    for s in cluster.servers:
        idle = s.gpus - used_gpus.get(s.id, 0)
        free_cores = s.cores - extras.get(s.id, NOTHING).cores
        short += max(0, min(idle, idle - free_cores))
    return short


class Speeds:
    """The true speed of each running job: its GPU-only speed (the ground
    truth, cached per configuration) times its cores' factor, times the
    memory-bandwidth slowdown of its servers (simulator.contention), which
    changes whenever a job starts, ends or changes cores beside it."""

    def __init__(self, cluster: Cluster, truth: GroundTruth) -> None:
        self.cluster, self.truth = cluster, truth
        self.cache: dict[tuple[str, Configuration], float] = {}
        self.contended = any(s.memory_bandwidth_gbps > 0 for s in cluster.servers)
        self.bandwidth: dict[ServerId, float] = {}

    def set(self, rec: JobRecord, config: Configuration, now: float) -> None:
        """``rec`` starts or goes on on ``config`` at ``now``: its base speed."""
        key = (rec.model, config)
        if key not in self.cache:
            self.cache[key] = speed(self.truth, rec.spec, rec.model, config)
        rec.base_rate = rec.rate = self.cache[key]
        rec.factor = rec.base_factor = core_factor(rec.model, config) \
            if rec.spec.kind != "cpu" else 1.0
        rec.rate_since = now

    def contend(self, running: Iterable[JobRecord]) -> None:
        """Every running job's speed under the bandwidth its neighbours use."""
        if not self.contended:
            return
        jobs = [r for r in running if r.current is not None]
        demand = server_demand((r.spec, r.model, r.current) for r in jobs
                               if r.current is not None)
        self.bandwidth = {s.id: min(demand.get(s.id, 0.0), s.memory_bandwidth_gbps)
                          for s in self.cluster.servers if s.memory_bandwidth_gbps > 0}
        for r in jobs:
            assert r.current is not None
            slow = slowdown(self.cluster, demand, r.spec, r.current, r.model)
            r.rate = r.base_rate * slow
            r.factor = r.base_factor * slow
