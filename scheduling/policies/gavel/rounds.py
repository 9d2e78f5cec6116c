"""Gavel's round-based scheduling mechanism (Narayanan et al., OSDI'20):
turn the time fractions ``X`` into one round's placements.

Each round, the priority of job ``j`` on type ``t`` is ``X[j][t]`` over the
fraction of time ``j`` has received on ``t``; a job that has received less
than its share comes first. Following ``scheduler/scheduler.py`` of
stanford-futuredata/gavel:

1. *selection* (``_schedule_jobs_on_workers_helper``): walk the (job, type)
   entries by descending priority, each type's queue in turn (fastest type
   first) or one global queue; take an entry when its job is not yet chosen
   and its rigid GPU count fits the type's GPUs left, else skip it;
2. *placement* (``_schedule_jobs_on_workers``): per type, from the largest
   jobs to the smallest, keep a job on its current servers when they are
   still free, then pack the others.

Departures (the first two because a snapshot carries no scheduler memory):

* The received fraction is ``attained_by_type[t] / (now - submit_time)``, the
  share of the job's whole life spent on ``t``. Gavel divides the job's time
  on ``t`` since the last allocation reset by the type's total busy time over
  the same span; within one type the two orders agree when jobs have been in
  the system equally long, and ours is on the scale of ``X`` itself.
* Ties break on the queue priority (latency ratio by default, as the Hops
  paper configures its baselines) where Gavel uses the deficit it keeps
  between allocation resets.
* Placement takes the best-fitting single server, else the fewest servers
  (largest free first), where Gavel walks a pointer across the type's servers
  (``_assign_workers_to_job``), so fewer jobs straddle servers. A job whose
  spread placement has no throughput (no distributed estimate) is skipped for
  the round; Gavel's placement cannot fail once the counts fit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import JobState

# Gavel's stand-in for "never served on this type" (scheduler.py: "Don't use
# inf so 2*new_priority > new_priority"): X * NEVER_SERVED ranks new jobs
# first, still in the order of their shares.
NEVER_SERVED = 1e9


@dataclass(frozen=True, slots=True)
class Entry:
    """One (job, type) candidate of a round."""

    job_id: JobId
    gpu_type: GpuType
    priority: float  # X / received fraction
    queue_priority: float  # tie-break: the Hops queue priority (e.g. latency ratio)
    share: float  # X[j][t]
    submit: float


def round_priority(job: JobState, gpu_type: GpuType, share: float, now: float) -> float:
    """``X[j][t]`` over the fraction of its time in the system that ``job``
    has run on ``gpu_type``; ``share * NEVER_SERVED`` when it has not."""
    elapsed = now - job.spec.submit_time
    received = job.attained_by_type.get(gpu_type, 0.0)
    if elapsed <= 0 or received <= 0:
        return share * NEVER_SERVED
    return share / min(1.0, received / elapsed)


def _key(e: Entry) -> tuple[float, float, float, float, str]:
    return (-e.priority, -e.queue_priority, -e.share, e.submit, e.job_id)


def queue_order(
    entries: Sequence[Entry], type_order: Sequence[GpuType], global_queue: bool
) -> list[Entry]:
    """Gavel's scan order: per type, fastest type first, each by descending
    priority; or all entries in one queue (``enable_global_queue``)."""
    if global_queue:
        rank = {t: i for i, t in enumerate(type_order)}
        return sorted(entries, key=lambda e: (*_key(e), rank[e.gpu_type]))
    out: list[Entry] = []
    for t in type_order:
        out.extend(sorted((e for e in entries if e.gpu_type == t), key=_key))
    return out


def select(
    order: Sequence[Entry], rigid: Mapping[JobId, int], left: Mapping[GpuType, int]
) -> dict[GpuType, list[JobId]]:
    """Phase 1: which jobs run on which type this round, by GPU counts only."""
    left = dict(left)
    chosen: dict[GpuType, list[JobId]] = {t: [] for t in left}
    done: set[JobId] = set()
    for e in order:
        n = rigid[e.job_id]
        if e.job_id in done or n > left.get(e.gpu_type, 0):
            continue
        left[e.gpu_type] -= n
        done.add(e.job_id)
        chosen[e.gpu_type].append(e.job_id)
    return chosen


def _keep(
    job: JobState, gpus: int, servers: set[ServerId], avail: Mapping[ServerId, int]
) -> Configuration | None:
    cur = job.current
    if cur is None or cur.total_gpus != gpus:
        return None
    if all(sid in servers and avail.get(sid, 0) >= g for sid, g in cur.parts):
        return cur
    return None


def pack(
    gpus: int,
    servers: Sequence[ServerId],
    avail: Mapping[ServerId, int],
    index: Mapping[ServerId, int],
) -> Configuration | None:
    """Consolidated where possible: the single server that fits most tightly,
    else the fewest servers, largest free first (cluster order on ties)."""
    fits = [s for s in servers if avail.get(s, 0) >= gpus]
    if fits:
        return Configuration.of({min(fits, key=lambda s: (avail[s], index[s])): gpus})
    parts: dict[ServerId, int] = {}
    need = gpus
    for s in sorted(
        (s for s in servers if avail.get(s, 0) > 0), key=lambda s: (-avail[s], index[s])
    ):
        take = min(need, avail[s])
        parts[s] = take
        need -= take
        if need == 0:
            return Configuration.of(parts)
    return None


Placed = tuple[Configuration, float]  # a placement and its throughput


def place_type(
    cluster: Cluster,
    gpu_type: GpuType,
    chosen: Sequence[JobId],
    jobs: Mapping[JobId, JobState],
    rigid: Mapping[JobId, int],
    avail: dict[ServerId, int],
    rate: Callable[[JobId, Configuration], float],
) -> dict[JobId, Placed | None]:
    """Phase 2 on one type: largest jobs first; within a size, jobs that can
    stay where they run, then the rest. ``avail`` is consumed in place. None
    marks a job with no placement, or only one at which ``rate`` (its
    throughput) is zero; it leaves its GPUs to the rest of the round."""
    servers = [s.id for s in cluster.servers_of_type(gpu_type)]
    own = set(servers)
    out: dict[JobId, Placed | None] = {}
    for size in sorted({rigid[j] for j in chosen}, reverse=True):
        group = [j for j in chosen if rigid[j] == size]
        for j in group:
            kept = _keep(jobs[j], size, own, avail)
            if kept is not None and (tput := rate(j, kept)) > 0:
                out[j] = (kept, tput)
                _take(avail, kept)
        for j in group:
            if j in out:
                continue
            config = pack(size, servers, avail, cluster.server_index)
            tput = rate(j, config) if config is not None else 0.0
            if config is None or tput <= 0:
                out[j] = None
                continue
            out[j] = (config, tput)
            _take(avail, config)
    return out


def _take(avail: dict[ServerId, int], config: Configuration) -> None:
    for sid, g in config.parts:
        avail[sid] -= g
