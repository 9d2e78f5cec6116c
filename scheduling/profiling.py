"""The profiling queue (Hops §3.2): served before anything else in a plan,
by the profiling-first layer around every policy
(:mod:`scheduling.layers.profiling_first`).

A new job runs a few iterations on one GPU of every type it has not been
profiled on, in parallel across types. Profiling takes GPUs first; the
planning passes get what is left. Two limits keep a burst of submissions
from taking the cluster over (the paper is silent on bursts):

- profiling uses *idle* GPUs: in a first plan, where running jobs are
  replanned and their GPUs count as free, it takes no running job's GPU, so
  profiling never preempts anything. The paper's profiling-first (§3.2),
  where a new job may take a running job's GPU at a round boundary, is the
  setting ``preempt`` (:data:`PROFILE_PREEMPT`); it still takes idle GPUs
  first. docs/results.md measures both;
- a job is not kept waiting for a profile on a GPU type every GPU of which
  trains a running job (:func:`busy_types`): once profiled on some type and
  with no run in flight, it joins the queue and is planned on the types it
  was profiled on, and while it waits it goes back to profiling once such a
  type has a GPU no job runs on (:func:`reprofile`; the live leader and the
  simulator apply both);
- profiling runs hold at most a share of each GPU type at a time
  (:data:`PROFILE_SHARE`, and never less than the type's largest server),
  counting the runs still in progress (``Snapshot.profiling_held``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from typing import NamedTuple

import msgspec

from shared.cluster import Cluster
from shared.ids import GpuType, ServerId
from shared.snapshot import JobState, ProfilingTask, Snapshot

# Share of each GPU type that profiling runs may hold at once. A quarter keeps
# three quarters of every type for training during a burst of submissions,
# while a trickle of new jobs is profiled at once as before.
PROFILE_SHARE = 0.25
# Whether profiling may take a running job's GPU at a round boundary (§3.2):
# off, so that a burst of submissions never stops running work.
PROFILE_PREEMPT = False


def profiling_budget(
    cluster: Cluster, profiling_held: Mapping[ServerId, int], share: float = PROFILE_SHARE
) -> dict[GpuType, int]:
    """GPUs of each type that new profiling runs may still take: the type's
    cap, ``max(ceil(share * GPUs of the type), its largest server)``, less
    what runs in progress hold."""
    budget: dict[GpuType, int] = {}
    for t in cluster.gpu_types:
        servers = tuple(cluster.servers_of_type(t.name))
        total = sum(s.gpus for s in servers)
        cap = max(math.ceil(share * total), max((s.gpus for s in servers), default=0))
        used = sum(profiling_held.get(s.id, 0) for s in servers)
        budget[t.name] = max(0, cap - used)
    return budget


def busy_types(cluster: Cluster, running: Mapping[ServerId, int]) -> frozenset[GpuType]:
    """GPU types every GPU of which a running job holds (``running``: GPUs
    per server): a profile there waits as long as those jobs run."""
    return frozenset(
        t.name
        for t in cluster.gpu_types
        if all(running.get(s.id, 0) >= s.gpus for s in cluster.servers_of_type(t.name))
    )


def queue_without(
    profiled: Set[GpuType], unprofiled: Set[GpuType], busy: Set[GpuType], in_flight: bool
) -> bool:
    """Whether a job still to profile on ``unprofiled`` joins the queue with
    the profiles it has: some type profiled, nothing in flight, and every
    type it lacks busy (see the module docstring)."""
    return bool(profiled) and not in_flight and bool(unprofiled) and unprofiled <= busy


def reprofile(deferred: Set[GpuType], busy: Set[GpuType]) -> frozenset[GpuType]:
    """The types a waiting job joined the queue without (``deferred``) that
    are no longer busy: it goes back to profiling for them."""
    return frozenset(deferred) - busy


class ProfilingStep(NamedTuple):
    """What a plan's start changes for one job still lacking profiles."""

    back: frozenset[GpuType]  # a waiting job goes back to profiling for these
    skip: frozenset[GpuType]  # the lacking types it may be queued without


def profiling_step(
    waiting: bool,
    profiled: Set[GpuType],
    lacking: Set[GpuType],
    busy: Set[GpuType],
    in_flight: bool,
    starting: bool = False,
) -> ProfilingStep:
    """One job's step, for the live leader and the simulator alike: a
    ``waiting`` job with no start in flight goes back to profiling for the
    lacking types no longer busy (:func:`reprofile`); a job may be queued
    without the lacking types once :func:`queue_without` allows it."""
    back = reprofile(lacking, busy) if waiting and not starting else frozenset()
    allowed = queue_without(profiled, lacking, busy, in_flight)
    return ProfilingStep(back, frozenset(lacking) if allowed else frozenset())


def idle_gpus(snapshot: Snapshot) -> dict[ServerId, int]:
    """GPUs no job holds: in a first plan, the free GPUs less the running
    jobs' (which the first plan may hand out again, but profiling must not);
    later in a round, running jobs are held already."""
    free = snapshot.free_gpus()
    if not snapshot.first_plan:
        return free
    running: Counter[ServerId] = Counter()
    for job in snapshot.jobs:
        if job.phase == "running" and job.current is not None:
            running.update(job.current.as_dict())
    return {sid: max(0, g - running.get(sid, 0)) for sid, g in free.items()}


def profile_first(
    snapshot: Snapshot,
    gpus_per_task: int = 1,
    share: float = PROFILE_SHARE,
    preempt: bool = PROFILE_PREEMPT,
) -> tuple[list[ProfilingTask], dict[ServerId, int]]:
    """The profiling tasks of a plan, on idle GPUs within the budget of each
    type (with ``preempt``, in a first plan, then on running jobs' GPUs), and
    the free GPUs the planning passes get (free less the tasks')."""
    budget = profiling_budget(snapshot.cluster, snapshot.profiling_held, share)
    tasks, _ = plan_profiling(
        snapshot.jobs, snapshot.cluster, idle_gpus(snapshot), gpus_per_task, budget
    )
    left = snapshot.free_gpus()
    for task in tasks:
        left[task.server] -= task.gpus
        budget[task.gpu_type] -= task.gpus
    if preempt and snapshot.first_plan:
        taken = {(t.job_id, t.gpu_type) for t in tasks}
        rest = [
            msgspec.structs.replace(
                j, unprofiled=tuple(u for u in j.unprofiled if (j.id, u) not in taken)
            )
            for j in snapshot.jobs
            if j.phase == "profiling"
        ]
        more, left = plan_profiling(rest, snapshot.cluster, left, gpus_per_task, budget)
        tasks += more
    return tasks, left


def plan_profiling(
    jobs: Sequence[JobState],
    cluster: Cluster,
    free: Mapping[ServerId, int],
    gpus_per_task: int = 1,
    budget: Mapping[GpuType, int] | None = None,
) -> tuple[list[ProfilingTask], dict[ServerId, int]]:
    """Place profiling runs first-come first-served on ``free``.

    Each run takes the server of its type with the fewest free GPUs that still
    fit it (best fit), so profiling leaves whole servers to the planner; a
    type whose ``budget`` is spent takes no more runs. Returns the tasks and
    the free GPUs that remain.
    """
    left = dict(free)
    room = dict(budget) if budget is not None else None
    tasks: list[ProfilingTask] = []
    waiting = sorted(
        (j for j in jobs if j.phase == "profiling" and j.unprofiled),
        key=lambda j: (j.spec.submit_time, j.id),
    )
    for job in waiting:
        for gpu_type in job.unprofiled:
            if room is not None and room.get(gpu_type, 0) < gpus_per_task:
                continue  # this type's profiling share is taken: wait for a run to end
            fits = [
                s.id
                for s in cluster.servers_of_type(gpu_type)
                if left.get(s.id, 0) >= gpus_per_task
            ]
            if not fits:
                continue  # stays in the profiling queue until a GPU of this type frees up
            best = min(fits, key=lambda sid: (left[sid], cluster.server_index[sid]))
            left[best] -= gpus_per_task
            if room is not None:
                room[gpu_type] -= gpus_per_task
            tasks.append(ProfilingTask(job.id, gpu_type, best, gpus_per_task))
    return tasks, left
