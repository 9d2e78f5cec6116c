"""How each core policy treats cores: CODA's and its three baselines'.

A rule answers four questions for the core layer (:mod:`.layer`), which
holds the mechanism they share:

- how many cores per GPU a GPU job gets (:meth:`CoreRule.per_gpu`);
- in which order the waiting CPU jobs are served (:meth:`CoreRule.order`);
- which of them go before the GPU jobs are planned (:meth:`CoreRule.ahead`):
  with one pool, a CPU job ahead in the queue takes its cores first.

The baselines are those of CODA's evaluation (§VI-A) and Slurm's fixed
``--cpus-per-gpu``. In all four the GPUs are planned by the inner policy
(Hops, Sia or Gavel), so FIFO and DRF here order the CPU jobs and decide
the cores, not the GPU jobs' order: a departure from the paper's baselines,
whose FIFO and DRF order the GPU jobs too (docs/coda.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from shared.ids import TenantId
from shared.snapshot import JobState, Snapshot


def requested_per_gpu(job: JobState) -> int:
    """The cores per GPU a GPU job's owner asked for: its ``cores`` over its
    smallest GPU requirement, rounded up, at least 1 (a request of none is
    Slurm's default of one core per task)."""
    spec = job.spec
    gpus = min(spec.requirement_set(), default=1)
    return max(1, math.ceil(spec.cores / gpus)) if spec.cores else 1


def held_shares(snapshot: Snapshot) -> dict[TenantId, tuple[float, float]]:
    """Each tenant's share of the cluster's GPUs and of its cores held by
    its running jobs."""
    gpus = sum(s.gpus for s in snapshot.cluster.servers) or 1
    cores = sum(s.cores for s in snapshot.cluster.servers) or 1
    held_g: Counter[TenantId] = Counter()
    held_c: Counter[TenantId] = Counter()
    for j in snapshot.jobs:
        if j.current is not None:
            held_g[j.spec.tenant] += j.current.total_gpus
            held_c[j.spec.tenant] += j.current.total_cores
    return {t: (held_g[t] / gpus, held_c[t] / cores) for t in {*held_g, *held_c}}


def dominant_shares(snapshot: Snapshot) -> dict[TenantId, float]:
    """Each tenant's dominant share: the larger of its GPU share and its
    core share (DRF, Ghodsi et al. NSDI'11)."""
    return {t: max(g, c) for t, (g, c) in held_shares(snapshot).items()}


def fifo_key(job: JobState) -> tuple[float, str]:
    return (job.spec.submit_time, job.spec.id)


class CoreRule(Protocol):
    name: str

    def per_gpu(self, job: JobState, snapshot: Snapshot) -> int: ...

    def order(self, jobs: Sequence[JobState], snapshot: Snapshot) -> list[JobState]: ...

    def ahead(self, cpu: Sequence[JobState], gpu_waiting: Sequence[JobState],
              snapshot: Snapshot) -> set[str]: ...


class Fifo:
    """FIFO with requested cores: one queue of both kinds by arrival; the
    CPU jobs that arrived before the oldest waiting GPU job take their
    cores first. A job that does not fit is passed over (first fit)."""

    name = "fifo"

    def per_gpu(self, job: JobState, snapshot: Snapshot) -> int:
        return requested_per_gpu(job)

    def order(self, jobs: Sequence[JobState], snapshot: Snapshot) -> list[JobState]:
        return sorted(jobs, key=fifo_key)

    def ahead(self, cpu: Sequence[JobState], gpu_waiting: Sequence[JobState],
              snapshot: Snapshot) -> set[str]:
        if not gpu_waiting:
            return {j.spec.id for j in cpu}
        oldest = min(fifo_key(j) for j in gpu_waiting)
        return {j.spec.id for j in cpu if fifo_key(j) < oldest}


class Drf:
    """DRF with requested cores: tenants served in order of their dominant
    share (GPUs or cores, whichever they hold more of); a tenant's CPU jobs
    go before the GPU jobs when its share is below that of every tenant
    with a GPU job waiting."""

    name = "drf"

    def per_gpu(self, job: JobState, snapshot: Snapshot) -> int:
        return requested_per_gpu(job)

    def order(self, jobs: Sequence[JobState], snapshot: Snapshot) -> list[JobState]:
        return drf_order(jobs, snapshot)

    def ahead(self, cpu: Sequence[JobState], gpu_waiting: Sequence[JobState],
              snapshot: Snapshot) -> set[str]:
        shares = dominant_shares(snapshot)
        floor = min((shares.get(j.spec.tenant, 0.0) for j in gpu_waiting), default=math.inf)
        return {j.spec.id for j in cpu if shares.get(j.spec.tenant, 0.0) < floor}


class FixedCores:
    """Slurm's ``--cpus-per-gpu``: every GPU job gets ``per_gpu_cores`` cores
    per GPU (0: each server's cores over its GPUs, rounded down); CPU jobs
    are served FIFO from the same pool."""

    name = "fixed-cores"

    def __init__(self, per_gpu_cores: int = 0) -> None:
        self.per_gpu_cores = per_gpu_cores
        self.fifo = Fifo()

    def per_gpu(self, job: JobState, snapshot: Snapshot) -> int:
        if self.per_gpu_cores:
            return self.per_gpu_cores
        return max(1, min((s.cores // s.gpus for s in snapshot.cluster.servers), default=1))

    def order(self, jobs: Sequence[JobState], snapshot: Snapshot) -> list[JobState]:
        return self.fifo.order(jobs, snapshot)

    def ahead(self, cpu: Sequence[JobState], gpu_waiting: Sequence[JobState],
              snapshot: Snapshot) -> set[str]:
        return self.fifo.ahead(cpu, gpu_waiting, snapshot)


def drf_order(jobs: Sequence[JobState], snapshot: Snapshot) -> list[JobState]:
    """``jobs`` in DRF order: the tenant with the smallest dominant share
    first, re-ranked as each job is served (its cores counted), FIFO
    within a tenant."""
    shares = dict(held_shares(snapshot))
    cores = sum(s.cores for s in snapshot.cluster.servers) or 1
    queues: dict[TenantId, list[JobState]] = {}
    for j in sorted(jobs, key=fifo_key):
        queues.setdefault(j.spec.tenant, []).append(j)
    out: list[JobState] = []
    while queues:
        tenant = min(queues, key=lambda t: (max(shares.get(t, (0.0, 0.0))), t))
        job = queues[tenant].pop(0)
        out.append(job)
        g, c = shares.get(tenant, (0.0, 0.0))
        shares[tenant] = (g, c + job.spec.cores / cores)
        if not queues[tenant]:
            del queues[tenant]
    return out


class Coda(Drf):
    """CODA's CPU array (§V-C): DRF among the CPU jobs' tenants, none ahead
    of the GPU jobs, which have their own array. The GPU jobs' cores come
    from the adaptive allocator (the layer's climb), not from here."""

    name = "coda"

    def ahead(self, cpu: Sequence[JobState], gpu_waiting: Sequence[JobState],
              snapshot: Snapshot) -> set[str]:
        return set()
