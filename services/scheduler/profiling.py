"""The profiling queue (Hops §3.2): served before anything else in a plan.

A new job runs a few iterations on one GPU of every type it has not been
profiled on, in parallel across types. Profiling takes GPUs first; the
planning passes get what is left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.cluster import Cluster
from shared.ids import ServerId
from shared.snapshot import JobState, ProfilingTask


def plan_profiling(
    jobs: Sequence[JobState],
    cluster: Cluster,
    free: Mapping[ServerId, int],
    gpus_per_task: int = 1,
) -> tuple[list[ProfilingTask], dict[ServerId, int]]:
    """Place profiling runs first-come first-served.

    Each run takes the server of its type with the fewest free GPUs that still
    fit it (best fit), so profiling leaves whole servers to the planner.
    Returns the tasks and the free GPUs that remain.
    """
    left = dict(free)
    tasks: list[ProfilingTask] = []
    waiting = sorted(
        (j for j in jobs if j.phase == "profiling" and j.unprofiled),
        key=lambda j: (j.spec.submit_time, j.id),
    )
    for job in waiting:
        for gpu_type in job.unprofiled:
            fits = [
                s.id
                for s in cluster.servers_of_type(gpu_type)
                if left.get(s.id, 0) >= gpus_per_task
            ]
            if not fits:
                continue  # stays in the profiling queue until a GPU of this type frees up
            best = min(fits, key=lambda sid: (left[sid], cluster.server_index[sid]))
            left[best] -= gpus_per_task
            tasks.append(ProfilingTask(job.id, gpu_type, best, gpus_per_task))
    return tasks, left
