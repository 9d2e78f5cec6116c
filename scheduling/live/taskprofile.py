"""Profiling runs under a task policy (docs/hare.md §7, step 2c).

The task loop needs a job's throughput on a GPU type (T^c, T^s) before it
can sequence it, and the estimator has one only from a profile: the job's
own, or its signature's shared one. The round-based leader gets profiles
by putting ``ProfilingTask``\\ s in its plans (§3.2); the task loop does the
same, in a plan of profiling tasks alone (no assignments, not a round's
first plan, so the placer stops nothing), which the placer starts as
``start_job`` with mode ``profile`` and the executors answer with
``profile_reported``, as for any plan.

:func:`profiling_tasks` asks for one run of each relaxed job without an
estimate on each alive GPU type it has no profile on, on one GPU of the
type's alive server with the most GPUs (a task sequence keeps that GPU
busy too: the profiling run is short, a few of the job's iterations, and
the emulated executors run both; real trainers would have to yield the GPU
for it, which is not built). A job asked for is not asked again before
``retry_s`` (a run lost with its server is asked for again then). Only a
job the estimators were asked about and had no estimate for is profiled:
a new job first asks them, since its signature may have a shared profile
(a run asked before that answer would train beside the trainers for
nothing).
:func:`to_estimate` names the jobs whose estimates the task loop asks for.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from collections.abc import Set as AbstractSet

from scheduling.live.state import LiveJobRecord
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId, ServerId
from shared.records import NodeRecord
from shared.snapshot import ProfilingTask

PROFILE_RETRY_S = 60.0  # a job's profiling runs asked for again after this long


def profiling_servers(nodes: Iterable[NodeRecord]) -> dict[GpuType, ServerId]:
    """Each alive GPU type's server a profiling run goes to: the one with the
    most GPUs, then the first by id."""
    best: dict[GpuType, NodeRecord] = {}
    for n in sorted(nodes, key=lambda n: n.server.id):
        cur = best.get(n.server.gpu_type)
        if n.alive and (cur is None or n.server.gpus > cur.server.gpus):
            best[n.server.gpu_type] = n
    return {t: n.server.id for t, n in sorted(best.items())}


def profiling_tasks(candidates: Iterable[LiveJobRecord], estimated: Iterable[JobId],
                    nodes: Iterable[NodeRecord], asked: Mapping[JobId, float], now: float,
                    unanswered: Container[JobId],
                    retry_s: float = PROFILE_RETRY_S) -> tuple[ProfilingTask, ...]:
    """The runs to ask for now (module docstring): ``candidates`` the jobs the
    task loop considers, ``estimated`` those with an estimate, ``asked``
    when each job's runs were last asked for, ``unanswered`` the jobs the
    estimators were asked about and had no estimate for (no others are
    profiled)."""
    servers = profiling_servers(nodes)
    have = set(estimated)
    tasks: list[ProfilingTask] = []
    for rec in candidates:
        job = rec.job_id
        if (rec.spec.sync_scale < 1 or job in have or job not in unanswered
                or now - asked.get(job, now - retry_s) < retry_s):
            continue
        tasks.extend(ProfilingTask(job, t, s, 1) for t, s in servers.items()
                     if t not in rec.profiled)
    return tuple(tasks)


def to_estimate(candidates: Iterable[LiveJobRecord], estimates: Mapping[JobId, JobEstimate],
                types: Iterable[GpuType]) -> dict[JobId, LiveJobRecord]:
    """The relaxed jobs to ask the estimators about: each without an
    estimate, and each whose estimate lacks an alive GPU type (``types``)
    that its record lists as profiled: a profile that came after the
    estimate (its second profiling run, say), which the round-based leader
    takes up as it asks for every job's estimate at each plan. Without it a
    job estimated from its first profile alone would run on that type only."""
    alive = set(types)
    out: dict[JobId, LiveJobRecord] = {}
    for rec in candidates:
        est = estimates.get(rec.job_id)
        if rec.spec.sync_scale > 0 and (
                est is None or (alive & set(rec.profiled)) - set(est.by_type)):
            out[rec.job_id] = rec
    return out


def ask_now(missing: Iterable[JobId], asked: AbstractSet[JobId], now: float,
            asked_at: float, resend_s: float) -> bool:
    """Whether to ask the estimators about ``missing`` (:func:`to_estimate`)
    now: at once when one of them was never asked about (a new job: its
    signature's shared profile may answer for it, and then it needs no
    profiling run of its own), else at most once per ``resend_s`` since the
    last ask at ``asked_at``."""
    pending = set(missing)
    if not pending:
        return False
    return bool(pending - asked) or now - asked_at >= resend_s
