"""Opportunistic jobs: idle GPUs shared among tenants by weighted max-min
(HiveD §3.3, "Allocating low-priority cells": "HiveD adopts weighted max-min
fairness [32, 43] to decide the numbers of low-priority cells allocated to
tenants").

Progressive filling: the next opportunistic placement goes to the tenant
whose opportunistic GPUs per unit of weight are fewest (ties: tenant name),
and within a tenant to its jobs in queue order. A job takes its smallest
requirement on the GPU type where its estimate is fastest among those with
an idle cell (:meth:`scheduling.cells.Cells.allocate` with
``opportunistic=True`` picks the cells). A job nothing can hold now is
skipped, and the filling goes on until no tenant has a job left. Running
opportunistic jobs keep their GPUs and count in their tenant's share; they
are not moved to even out shares (a departure: HiveD does not say whether
it rebalances, and rebalancing would preempt for fairness alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduling.cells import Allocation, Cells
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId
from shared.snapshot import JobState


def speed(est: JobEstimate, gpu: GpuType, gpus: int) -> float:
    curve = est.by_type.get(gpu)
    return curve.agg_per_gpu(gpus) * gpus if curve is not None else 0.0


def place_one(cells: Cells, job: JobState, est: JobEstimate, r_num: int,
              failed: dict[GpuType, int]) -> Configuration | None:
    """The job on idle GPUs, at its smallest requirement, fastest type first.
    ``failed`` is the fewest GPUs of each type found not to fit in this pass
    (idle cells only shrink during it), so a hopeless request is not retried."""
    gpus = job.spec.requirement_set(r_num)[0]
    types = sorted((t for t in cells.model.chains if speed(est, t, gpus) > 0),
                   key=lambda t: (-speed(est, t, gpus), t))
    for gpu in types:
        if gpus >= failed.get(gpu, gpus + 1):
            continue
        got = cells.allocate(job.spec.tenant, gpu, gpus, job.id, opportunistic=True)
        if isinstance(got, Allocation):
            return Configuration.of(got.servers())
        if got.reason == "no-capacity":
            failed[gpu] = min(gpus, failed.get(gpu, gpus))
    return None


def share(cells: Cells, queues: Mapping[str, Sequence[JobState]],
          estimates: Mapping[JobId, JobEstimate], usage: Mapping[str, int],
          r_num: int) -> dict[JobId, Configuration]:
    """Weighted max-min placement of the waiting jobs of ``queues`` (by
    tenant, in queue order) on idle GPUs; ``usage`` is each tenant's
    opportunistic GPUs already running."""
    weights = cells.weights()
    used = {t: usage.get(t, 0) for t in queues}
    left = {t: [j for j in q if j.id in estimates] for t, q in queues.items()}
    out: dict[JobId, Configuration] = {}
    failed: dict[GpuType, int] = {}
    if not any(cells.idle_gpus().values()):
        return out
    while True:
        waiting = [t for t in sorted(left) if left[t]]
        if not waiting:
            return out
        tenant = min(waiting, key=lambda t: (used[t] / weights.get(t, 1.0), t))
        job = left[tenant].pop(0)
        config = place_one(cells, job, estimates[job.id], r_num, failed)
        if config is not None:
            out[job.id] = config
            used[tenant] += config.total_gpus
