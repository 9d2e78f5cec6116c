"""HiveD's Figure 8 stress test, synthetic, directly on the cells core
(HiveD §5.2 "GPU affinity requirement vs. Sharing safety").

Tenants are split into a group whose jobs all take 1x8 GPUs (one node) and
a group whose jobs all take 1x1; a tenant's offered GPU load stays the same
whichever group it is in (8-GPU jobs arrive 8 times less often). Starting
with only ``res-f`` in the 8-GPU group, tenants move to it one by one, which
lowers the *workload fragmentation* (jobs / GPUs requested, 1 when every job
takes one GPU). For each step, ``res-f``'s average queuing delay is compared
under three schemes, all running jobs with hard affinity in submission order
with backfilling and no opportunistic jobs:

* **private**: each tenant alone on a cluster of its quota's nodes;
* **quota**: one cluster of all the nodes, a tenant may use up to its quota
  in GPUs anywhere (1-GPU jobs best fit on the fullest node that has room,
  an 8-GPU job needs an empty node);
* **hived**: the same cluster through :class:`scheduling.cells.Cells`, each
  tenant reserving its quota as node-level cells (guaranteed jobs only).

The workload is synthetic (Poisson arrivals, exponential run times from a
seeded generator), not the paper's trace: it reproduces the figure's
experiment, not its numbers. Pure: no clock, randomness only from the seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import msgspec
import numpy as np

from experiments.sharing.cluster import cells_doc, server_ids, sharing_cluster
from scheduling.cells import Allocation, Cells, cells_from_doc
from shared.cluster import Cluster
from shared.ids import GpuType, ServerId

NODE = 8
Placement = Literal["pack", "spread"]


class StressJob(msgspec.Struct, frozen=True):
    id: str
    tenant: str
    gpus: int
    submit_h: float
    run_h: float


class StressSettings(msgspec.Struct, frozen=True):
    """Quotas in 8-GPU nodes; each tenant offers ``load`` x its quota's GPUs
    on average over ``days``; run times are exponential with mean ``mean_h``."""

    quotas: dict[str, int] = msgspec.field(default_factory=lambda: {
        "res-f": 16, "prod-e": 8, "prod-d": 8, "prod-c": 8,
        "rest-a": 8, "rest-b": 8, "rest-c": 8})
    steps: tuple[str, ...] = ("res-f", "prod-e", "prod-d", "prod-c")
    load: float = 0.9
    days: float = 14.0
    mean_h: float = 4.0
    seed: int = 0
    # Placements of jobs smaller than a node under quota and private, each run.
    placements: tuple[Placement, ...] = ("pack", "spread")


def stress_jobs(settings: StressSettings, wide: set[str]) -> list[StressJob]:
    """Each tenant's Poisson stream: 8-GPU jobs for tenants in ``wide``, else
    1-GPU jobs, at the rate that offers ``load`` x its quota in GPUs. The
    generator is seeded per tenant, so a tenant's 1-GPU stream is the same in
    every step."""
    jobs: list[StressJob] = []
    horizon = settings.days * 24.0
    for k, (tenant, nodes) in enumerate(sorted(settings.quotas.items())):
        gpus = NODE if tenant in wide else 1
        rate = settings.load * nodes * NODE / (gpus * settings.mean_h)  # jobs per hour
        rng = np.random.default_rng([settings.seed, k, gpus])
        t, i = float(rng.exponential(1 / rate)), 0
        while t < horizon:
            run = max(0.05, float(rng.exponential(settings.mean_h)))
            jobs.append(StressJob(f"{tenant}-{i}", tenant, gpus, t, run))
            t += float(rng.exponential(1 / rate))
            i += 1
    return sorted(jobs, key=lambda j: (j.submit_h, j.id))


class Placer(Protocol):
    def start(self, job: StressJob) -> bool: ...
    def finish(self, job: StressJob) -> None: ...
    def busy_nodes(self) -> int: ...


class QuotaPlacer:
    """GPU quotas over physical nodes: a tenant uses at most its quota. A job
    smaller than a node goes to the fullest node with room (``pack``, as
    YARN-CS in §5.1) or to the emptiest (``spread``, kube-scheduler's default
    LeastAllocated scoring under a Kueue quota)."""

    def __init__(self, nodes: int, quota_gpus: Mapping[str, int],
                 placement: Placement = "pack") -> None:
        self.spread = placement == "spread"
        self.used = [0] * nodes
        self.quota = dict(quota_gpus)
        self.tenant_used: dict[str, int] = {}
        self.where: dict[str, list[int]] = {}

    def start(self, job: StressJob) -> bool:
        if self.tenant_used.get(job.tenant, 0) + job.gpus > self.quota[job.tenant]:
            return False
        if job.gpus >= NODE:
            free = [i for i, u in enumerate(self.used) if u == 0][: job.gpus // NODE]
            if len(free) < job.gpus // NODE:
                return False
            nodes = free
        else:
            fits = [(u if self.spread else -u, i) for i, u in enumerate(self.used)
                    if NODE - u >= job.gpus]
            if not fits:
                return False
            nodes = [min(fits)[1]]
        for i in nodes:
            self.used[i] += min(NODE, job.gpus)
        self.where[job.id] = nodes
        self.tenant_used[job.tenant] = self.tenant_used.get(job.tenant, 0) + job.gpus
        return True

    def finish(self, job: StressJob) -> None:
        for i in self.where.pop(job.id):
            self.used[i] -= min(NODE, job.gpus)
        self.tenant_used[job.tenant] -= job.gpus

    def busy_nodes(self) -> int:
        return sum(1 for u in self.used if u)


class CellsPlacer:
    """HiveD: guaranteed allocations through buddy cell allocation."""

    def __init__(self, cells: Cells, gpu: GpuType) -> None:
        self.cells, self.gpu = cells, gpu
        self.used: dict[ServerId, int] = {}

    def start(self, job: StressJob) -> bool:
        got = self.cells.allocate(job.tenant, self.gpu, job.gpus, job.id)
        if not isinstance(got, Allocation):
            return False
        for p in got.placement:
            self.used[p.server] = self.used.get(p.server, 0) + p.gpus
        return True

    def finish(self, job: StressJob) -> None:
        for p in self.cells.allocation(job.id).placement:
            self.used[p.server] -= p.gpus
        self.cells.release(job.id)

    def busy_nodes(self) -> int:
        return sum(1 for g in self.used.values() if g)


class StressRun(msgspec.Struct, frozen=True):
    waits_h: dict[str, float]  # job id -> queuing delay
    fragmentation: float  # time average of the busy-node share (§5.2's level)


def replay(jobs: Sequence[StressJob], placer: Placer, nodes: int) -> StressRun:
    """Submission order with backfilling: at each arrival or completion,
    every waiting job that fits now starts. The fragmentation level is
    averaged over the submission window."""
    events: list[tuple[float, int, str]] = [(j.submit_h, 1, j.id) for j in jobs]
    heapq.heapify(events)
    window = max((j.submit_h for j in jobs), default=0.0)
    by_id = {j.id: j for j in jobs}
    waiting: list[StressJob] = []
    waits: dict[str, float] = {}
    area, last, share = 0.0, 0.0, 0.0
    while events:
        now = events[0][0]
        area += share * (min(now, window) - min(last, window))
        last = now
        while events and events[0][0] <= now:
            _, kind, jid = heapq.heappop(events)
            if kind == 0:
                placer.finish(by_id[jid])
            else:
                waiting.append(by_id[jid])
        still: list[StressJob] = []
        refused: set[tuple[str, int]] = set()  # starts only take GPUs: same shape, same answer
        for job in waiting:
            if (job.tenant, job.gpus) not in refused and placer.start(job):
                waits[job.id] = now - job.submit_h
                heapq.heappush(events, (now + job.run_h, 0, job.id))
            else:
                refused.add((job.tenant, job.gpus))
                still.append(job)
        waiting = still
        share = placer.busy_nodes() / nodes
    return StressRun(waits, area / window if window > 0 else 0.0)


def _cluster(quotas: Mapping[str, int]) -> tuple[Cluster, list[ServerId]]:
    from world.clusters import builtin_cluster

    ids = server_ids(quotas)
    every = [s for t in quotas for s in ids[t]]
    return sharing_cluster(builtin_cluster("paper-sim-512"), GpuType("GTX1080Ti"), every,
                           "stress"), every


def step(settings: StressSettings, wide: set[str]) -> dict[str, object]:
    """One bar group of Figure 8: the workload fragmentation and, per scheme
    (``hived``, and ``quota-<placement>`` and ``private-<placement>`` per
    placement), every tenant's average queuing delay (h) and the
    fragmentation level."""
    jobs = stress_jobs(settings, wide)
    q = settings.quotas
    total = sum(q.values())
    cluster, every = _cluster(q)
    gpu = GpuType("GTX1080Ti")
    cells = Cells(cells_from_doc(cells_doc(gpu, q, every), cluster, "stress-cells"))
    runs = {"hived": replay(jobs, CellsPlacer(cells, gpu), total)}
    for how in settings.placements:
        quota = QuotaPlacer(total, {t: n * NODE for t, n in q.items()}, how)
        runs[f"quota-{how}"] = replay(jobs, quota, total)
        alone = [replay([j for j in jobs if j.tenant == t], QuotaPlacer(n, {t: n * NODE}, how), n)
                 for t, n in q.items()]
        runs[f"private-{how}"] = StressRun({k: w for r in alone for k, w in r.waits_h.items()},
                                           0.0)
    tenant = {j.id: j.tenant for j in jobs}
    return {
        "wide": sorted(wide),
        "workload_fragmentation": len(jobs) / sum(j.gpus for j in jobs),
        "jobs": len(jobs),
        "avg_wait_h": {k: {t: _mean([w for j, w in r.waits_h.items() if tenant[j] == t])
                           for t in q} for k, r in runs.items()},
        "fragmentation_level": {k: r.fragmentation for k, r in runs.items()
                                if not k.startswith("private")},
        "unfinished": {k: len(jobs) - len(r.waits_h) for k, r in runs.items()},
    }


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def figure8(settings: StressSettings | None = None) -> list[dict[str, object]]:
    """The steps of Figure 8: tenants of ``settings.steps`` join the 8-GPU
    group one by one."""
    s = settings or StressSettings()
    return [step(s, wide) for wide in joined(s)]


def joined(settings: StressSettings) -> list[set[str]]:
    """Each step's 8-GPU group: the first k tenants of ``settings.steps``."""
    return [set(settings.steps[: k + 1]) for k in range(len(settings.steps))]
