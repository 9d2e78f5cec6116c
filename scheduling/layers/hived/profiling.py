"""Profiling inside each virtual cluster (Hops §3.2 within HiveD §3.1).

The profiling queue is part of the policy that runs inside a virtual
cluster: the registry puts the profiling-first layer beneath the HiveD
layer, so a tenant's new jobs are profiled on its VC view, on GPUs of its
own cells, exactly as in its private cluster. Each profiling run the inner
policy asks for is bound like a guaranteed job (:meth:`Cells.allocate_on`,
one GPU on the virtual server it names) under a holder id of its own, and
shown in the tenant's later views as a profiling hold on that virtual
server. A run gives its cell back once the snapshot no longer counts it
(``Snapshot.profiling_held`` of its server falls).

What no virtual cluster can profile is profiled on idle GPUs, outside the
cells, as opportunistic work: jobs of low-priority tenants and jobs beyond
their tenant's cells (only while opportunistic jobs are on: they run nowhere
else), and any job's GPU types its tenant reserves none of (a measurement of
a few iterations, so that the job's profile is complete and it can leave the
profiling queue, as outside HiveD).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec

from scheduling.cells import Allocation, Cells, Refusal, VirtualSlot
from scheduling.cells.opportunistic import idle
from scheduling.layers.profiling_first import ProfilingSettings
from scheduling.profiling import profile_first
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import JobState, ProfilingTask, Snapshot

PROF = "\x00prof:"  # holder ids of profiling runs bound in a tenant's cells
HOLD = "\x00held:"  # holder ids of physical holds, released after each plan (never a job id)


def prof_id(job: JobId, gpu: GpuType) -> str:
    """A run's holder id: a job has at most one run per GPU type at a time."""
    return f"{PROF}{gpu}:{job}"


def job_of(holder: str) -> JobId:
    return JobId(holder[len(PROF):].split(":", 1)[1])


def reconcile_profiling(cells: Cells, snapshot: Snapshot) -> None:
    """Runs that ended, or never started, give their cells back: on each
    server, the runs beyond the GPUs ``profiling_held`` counts there, those
    of jobs no longer profiling first."""
    phase = {j.id: j.phase for j in snapshot.jobs}
    per: dict[ServerId, list[tuple[bool, str, int]]] = {}
    for holder in sorted(cells.jobs):
        if holder.startswith(PROF):
            going = phase.get(job_of(holder)) == "profiling"
            for sid, gpus in cells.allocation(holder).servers().items():
                per.setdefault(sid, []).append((going, holder, gpus))
    for sid, runs in sorted(per.items()):
        extra = sum(g for *_, g in runs) - snapshot.profiling_held.get(sid, 0)
        for _, holder, gpus in sorted(runs):
            if extra <= 0:
                break
            cells.release(holder)
            extra -= gpus


def virtual_runs(cells: Cells, virtual: Mapping[JobId, Configuration], tenant: str
                 ) -> dict[ServerId, int]:
    """The tenant's profiling runs in flight, per virtual server."""
    out: Counter[ServerId] = Counter()
    for holder, held in cells.jobs.items():
        config = virtual.get(JobId(holder))
        if holder.startswith(PROF) and held.tenant == tenant and config is not None:
            out.update(config.as_dict())
    return dict(sorted(out.items()))


def bind_task(cells: Cells, tenant: str, slot: VirtualSlot, task: ProfilingTask
              ) -> Allocation | Refusal:
    """A profiling run the inner policy placed on a virtual server, bound in
    the physical cell of that server (a stale run of the same job and type,
    which can no longer be going on, gives its cell back first)."""
    holder = prof_id(task.job_id, task.gpu_type)
    cells.release(holder)
    return cells.allocate_on(tenant, task.gpu_type, [(slot, task.gpus)], holder)


def outside_types(job: JobState, in_vc: bool, reserved: Sequence[GpuType],
                  opportunistic: bool) -> tuple[GpuType, ...]:
    """The GPU types a profiling job is to be profiled on outside the cells."""
    if job.phase != "profiling":
        return ()
    if in_vc:
        return tuple(t for t in job.unprofiled if t not in reserved)
    return tuple(job.unprofiled) if opportunistic else ()


def profile_outside(cells: Cells, snapshot: Snapshot, jobs: Sequence[JobState],
                    settings: ProfilingSettings) -> list[ProfilingTask]:
    """Profiling runs on idle GPUs outside every cell use (the profiling
    queue of Hops §3.2 over what the cells leave idle), kept out of the
    cells for the rest of the plan as holds."""
    if not jobs:
        return []
    busy = _busy(cells, snapshot.cluster)
    view = msgspec.structs.replace(snapshot, jobs=tuple(jobs), held=busy, first_plan=False,
                                   estimates={})
    tasks, _ = profile_first(view, settings.gpus, settings.share, preempt=False)
    for task in tasks:
        cells.hold(task.server, task.gpus, HOLD + prof_id(task.job_id, task.gpu_type))
    return tasks


def _busy(cells: Cells, cluster: Cluster) -> dict[ServerId, int]:
    """GPUs of each server that the cells do not have idle (jobs, holds,
    profiling runs), or that the cells do not know (all of them held)."""
    out: dict[ServerId, int] = {}
    tree = cells.tree
    for server in cluster.servers:
        node = tree.node_of.get(server.id)
        if node is None:
            out[server.id] = server.gpus
            continue
        free = sum(1 for leaf in tree.leaves[node] if idle(tree, cells.buddy, leaf))
        out[server.id] = server.gpus - free
    return out
