"""A reservation for the queue's head (``HopsSettings.reserve_head``): EASY
backfill, as Slurm's backfill scheduler makes it, in Hops' fill passes.

The paper's fill plans (§3.6) give every GPU freed during a round to the
jobs that fit on it *now*, which are the small ones; a wide job at the head
of the queue then waits until its latency ratio dominates a first plan, and
preempts many small jobs when it does (issue 38). With a reservation, when
the highest-priority waiting job does not fit on the idle GPUs, it is given
the GPU type on which enough GPUs free up soonest, counting the running
jobs' estimated ends (its *shadow time* there); a fill pass may then start
another job on that type only if that job's estimated run there ends by the
shadow time. The head keeps its place in Eq. (11)'s weights; only the other
jobs' options on the reserved type are removed.

Estimates: a running job ends after its remaining samples at its estimated
speed where it runs; a candidate's run is its remaining samples at its
fastest estimated speed on the type (optimistic, as a job's own time limit
is in Slurm). Servers count by their GPUs only: the head may still need
them on fewer servers than the shadow time assumes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from scheduling.backfill import ends_by, shadow
from scheduling.policies.hops.steady import Room
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, config_throughput
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import Assignment, JobState, Snapshot


class Reservation(msgspec.Struct, frozen=True):
    """The head's GPU type and the time (s) enough of it is free."""

    job_id: JobId
    gpu_type: GpuType
    until: float


def _fastest_on(est: JobEstimate, gpu_type: GpuType, requirements: Sequence[int]) -> float:
    curve = est.by_type.get(gpu_type)
    if curve is None or not curve.agg:
        return 0.0
    return max(curve.agg_per_gpu(min(g, len(curve.agg))) * min(g, len(curve.agg))
               for g in requirements)


def shadow_times(
    cluster: Cluster,
    free: Mapping[ServerId, int],
    ends: Iterable[tuple[float, Configuration]],
    need: int,
) -> dict[GpuType, float]:
    """Per GPU type, the earliest time at which ``need`` of its GPUs are free:
    the idle ones now, then the running jobs' GPUs at their estimated ends
    (``inf`` where they never add up)."""
    type_of = {s.id: s.gpu_type for s in cluster.servers}
    now_free: dict[GpuType, int] = {}
    for sid, gpus in free.items():
        if sid in type_of:
            now_free[type_of[sid]] = now_free.get(type_of[sid], 0) + gpus
    releases = [(end, [(type_of[sid], gpus) for sid, gpus in config.parts if sid in type_of])
                for end, config in ends]
    out: dict[GpuType, float] = {}
    for t in {s.gpu_type for s in cluster.servers}:
        def fit(have: Mapping[GpuType, int], t: GpuType = t) -> GpuType | None:
            return t if have.get(t, 0) >= need else None

        found = shadow(now_free, releases, -math.inf, fit)
        out[t] = found.start if found is not None else math.inf
    return out


def reserve(
    head: JobState,
    est: JobEstimate,
    need: int,
    cluster: Cluster,
    free: Mapping[ServerId, int],
    ends: Iterable[tuple[float, Configuration]],
    now: float,
) -> Reservation | None:
    """The head's reservation: among the types it has an estimate for, the
    one whose shadow time comes first (then the faster for it); None where
    no type ever has ``need`` GPUs free, or where enough are idle now (the
    head is then held back by its servers' shape, which counting GPUs
    cannot reserve: blocking the type would only idle it)."""
    times = shadow_times(cluster, free, ends, need)
    options = [(times.get(t, math.inf), -_fastest_on(est, t, (need,)), str(t), t)
               for t in est.by_type]
    if not options:
        return None
    until, _, _, gpu_type = min(options)
    return None if math.isinf(until) or until <= now else Reservation(head.id, gpu_type, until)


def head_reservation(
    snapshot: Snapshot,
    jobs: Mapping[JobId, JobState],
    head: JobId,
    free: Mapping[ServerId, int],
    placed: Sequence[Assignment],
    r_num: int,
    sigma: float,
) -> Reservation | None:
    """The reservation of ``head`` when nothing on ``free`` can serve it:
    the GPUs ``placed`` this call free at their jobs' estimated ends, and in
    a plan later in the round so do the running jobs' (whose GPUs the
    snapshot holds). ``jobs``: every job of the call, the exempt ones too."""
    est, job = snapshot.estimates.get(head), jobs.get(head)
    if est is None or job is None:
        return None
    reqs = job.spec.requirement_set(r_num)
    if Room(snapshot.cluster, free).admits(reqs, est, sigma):
        return None
    now = snapshot.now
    ends = [(end_time(now, jobs[a.job_id], a.throughput), a.config)
            for a in placed if a.job_id in jobs]
    if not snapshot.first_plan:
        for j in snapshot.jobs:
            e = snapshot.estimates.get(j.id)
            if j.phase == "running" and j.current is not None and e is not None:
                speed = config_throughput(e, snapshot.cluster, j.current)
                ends.append((end_time(now, j, speed), j.current))
    return reserve(job, est, reqs[0], snapshot.cluster, free, ends, now)


def end_time(now: float, job: JobState, speed: float) -> float:
    """When a job running at ``speed`` samples/s is estimated to end."""
    return now + job.remaining_samples / speed if speed > 0 else math.inf


def backfill(
    r: Reservation,
    now: float,
    cluster: Cluster,
    jobs: Mapping[JobId, JobState],
    estimates: Mapping[JobId, JobEstimate],
    r_num: int,
) -> dict[JobId, JobEstimate]:
    """``estimates`` with the reserved type removed from every waiting job
    but the head whose estimated run there would end after the shadow time.
    A running job that a first plan left without GPUs keeps its options:
    its restart cost is read off its speed where it runs (reconfig.py)."""
    servers = {s.id for s in cluster.servers if s.gpu_type == r.gpu_type}
    out = dict(estimates)
    for jid, job in jobs.items():
        est = estimates.get(jid)
        if (jid == r.job_id or est is None or job.current is not None
                or r.gpu_type not in est.by_type):
            continue
        speed = _fastest_on(est, r.gpu_type, job.spec.requirement_set(r_num))
        if speed > 0 and ends_by(now, job.remaining_samples / speed, r.until):
            continue
        out[jid] = msgspec.structs.replace(
            est,
            by_type={t: c for t, c in est.by_type.items() if t != r.gpu_type},
            by_server={s: c for s, c in est.by_server.items() if s not in servers},
        )
    return out
