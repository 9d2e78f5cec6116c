"""A Slurm-style baseline: multifactor priority (age and job size) with EASY
backfill, whole-GPU requests at the job's requested count, no elasticity, no
preemption, behind ``plan(snapshot) -> Plan``. What most GPU clusters run
today (docs/baselines.md, "Slurm-style").

Sources: Slurm's documentation, ``priority/multifactor`` (the age and job
size factors, ``PriorityWeightAge``, ``PriorityMaxAge``,
``PriorityWeightJobSize``, ``PriorityFavorSmall`` and the configuration
example the settings' defaults come from), ``sched/backfill`` and
``select/cons_tres``; EASY backfill as Lifka (JSSPP'95) and Mu'alem and
Feitelson (IEEE TPDS 2001) define it (:mod:`.backfill`).

Every plan, a round's first or a later one, is one scheduling pass, as
Slurm runs one on every submission and completion: running jobs keep their
GPUs (a first plan lists them again; one whose GPUs went down is requeued),
queued jobs are ordered by priority, then submission, then id, and the
backfill pass starts what it may.

Time limits. Slurm plans its reservations with each job's time limit
(``--time``). A job that gives one (``JobSpec.time_limit``) is planned with
it. The traces give none, so a job without one is planned with
``limit_factor`` times its run time as predicted from its profiles on the
slowest GPU type it may land on (what a user asks for to be safe wherever the
job lands): the system-generated predictions of Tsafrir, Etsion and
Feitelson ("Backfilling using system-generated predictions rather than user
runtime estimates", IEEE TPDS 18(6), 2007). A job that outlives its limit is
not killed, unlike under Slurm: its end is taken to be now, and the next
pass plans again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scheduling.layers.base import LayeredPolicy
from scheduling.policies.gavel.lp import type_throughput
from scheduling.policies.rigid import (
    Avail,
    RigidSettings,
    fits,
    place,
    plannable,
    rigid_requirement,
    runnable_types,
    take,
    type_curves,
)
from scheduling.policies.slurm.backfill import Outcome, Running, Waiting, easy_backfill
from scheduling.priorities import latency_ratios
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, config_throughput
from shared.ids import GpuType, JobId
from shared.snapshot import Assignment, JobState, PassStats, Plan, PlanReasons, Snapshot

DAY_S = 86400.0


class SlurmSettings(RigidSettings, frozen=True, forbid_unknown_fields=True):
    """The site's ``slurm.conf``, as far as it decides this scheduler's
    order. The weights and the maximum age are the values of the
    configuration example in Slurm's multifactor documentation
    (``PriorityWeightAge=1000``, ``PriorityWeightJobSize=1000``,
    ``PriorityMaxAge=14-0``, ``PriorityFavorSmall=NO``); the other factors
    (fair share, partition, QOS, association, nice, TRES) are zero, since the
    traces have one user and one queue."""

    weight_age: float = 1000.0  # PriorityWeightAge
    weight_size: float = 1000.0  # PriorityWeightJobSize
    max_age_s: float = 14 * DAY_S  # PriorityMaxAge: the age factor is 1 from here on
    favor_small: bool = False  # PriorityFavorSmall
    # A job's time limit without its own: this times its predicted run time.
    limit_factor: float = 1.0
    backfill: bool = True  # false: sched/builtin, strict priority order

    def __post_init__(self) -> None:
        for name in ("weight_age", "weight_size"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not (math.isfinite(self.max_age_s) and self.max_age_s > 0):
            raise ValueError(f"max_age_s must be finite and > 0, got {self.max_age_s}")
        if not (math.isfinite(self.limit_factor) and self.limit_factor > 0):
            raise ValueError(f"limit_factor must be finite and > 0, got {self.limit_factor}")


def age_factor(job: JobState, now: float, max_age_s: float) -> float:
    """Slurm's age factor: time since submission over ``PriorityMaxAge``,
    at most 1."""
    return min(max(0.0, now - job.spec.submit_time) / max_age_s, 1.0)


def size_factor(gpus: int, total_gpus: int, favor_small: bool) -> float:
    """Slurm's job size factor, counted in GPUs: the share of the cluster
    the job asks for (1 for the whole cluster), or with ``PriorityFavorSmall``
    1 for the smallest request, falling linearly to 1/total for the whole
    cluster."""
    if total_gpus <= 0:
        return 0.0
    share = min(gpus, total_gpus) / total_gpus
    return 1.0 - share + 1.0 / total_gpus if favor_small else share


def multifactor(job: JobState, gpus: int, now: float, total_gpus: int,
                s: SlurmSettings) -> float:
    """``PriorityWeightAge * age + PriorityWeightJobSize * size`` (the
    factors this project's jobs have)."""
    return (s.weight_age * age_factor(job, now, s.max_age_s)
            + s.weight_size * size_factor(gpus, total_gpus, s.favor_small))


def time_limit_s(job: JobState, est: JobEstimate, cluster: Cluster, gpus: int,
                 types: Sequence[GpuType], factor: float) -> float:
    """The job's own limit, else ``factor`` times its predicted run time on
    the slowest of ``types`` (inf when nothing predicts one)."""
    if job.spec.time_limit is not None:
        return job.spec.time_limit
    rates = [type_throughput(est, cluster, t, gpus) for t in types]
    slowest = min((r for r in rates if r > 0), default=0.0)
    return factor * job.spec.total_samples / slowest if slowest > 0 else math.inf


class SlurmPolicy(LayeredPolicy):
    """Multifactor priority with EASY backfill (module docstring)."""

    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None) -> None:
        self.settings = settings or SlurmSettings()

    def plan_inner(self, snapshot: Snapshot) -> Plan:
        s, cluster, now = self.settings, snapshot.cluster, snapshot.now
        jobs = {j.id: j for j in snapshot.jobs if plannable(j, snapshot.estimates)}
        ests = {jid: type_curves(snapshot.estimates[jid]) for jid in jobs}
        gpus = {jid: rigid_requirement(j.spec, s.r_num) for jid, j in jobs.items()}
        types = {jid: runnable_types(cluster, ests[jid], gpus[jid]) for jid in jobs}
        limits = {jid: time_limit_s(j, ests[jid], cluster, gpus[jid], types[jid], s.limit_factor)
                  for jid, j in jobs.items()}
        avail: Avail = snapshot.free_gpus()
        kept, running = _running(snapshot, jobs, limits, avail)
        prios = {jid: multifactor(j, gpus[jid], now, cluster.total_gpus, s)
                 for jid, j in jobs.items()}
        holding = {r.job_id for r in running}
        queued = sorted((jid for jid in jobs if jid not in holding),
                        key=lambda jid: (-prios[jid], jobs[jid].spec.submit_time, jid))
        queue = [Waiting(jid, gpus[jid], limits[jid]) for jid in queued]

        def placer(job: Waiting, free: Avail) -> Configuration | None:
            return place(cluster, job.gpus, free, types[job.job_id], ests[job.job_id])

        out = easy_backfill(queue, avail, running, now, placer, s.backfill)
        configs = {**kept, **out.started}
        assignments = tuple(
            Assignment(jid, cfg, config_throughput(ests[jid], cluster, cfg))
            for jid, cfg in configs.items())
        reasons = PlanReasons(
            policy=self.name, priorities=prios,
            latency_ratios=latency_ratios(snapshot, jobs, s.r_num),
            passes=(_stats(snapshot.first_plan, len(queue), out),))
        return Plan(assignments, (), reasons)


def _running(
    snapshot: Snapshot,
    jobs: Mapping[JobId, JobState],
    limits: Mapping[JobId, float],
    avail: Avail,
) -> tuple[dict[JobId, Configuration], list[Running]]:
    """The running jobs with the time their limits leave them. In a first
    plan each keeps its GPUs (returned to be listed again, and booked in
    ``avail``); one whose GPUs are no longer free is requeued, as Slurm
    requeues a job whose node failed. In a later plan they are held already."""
    kept: dict[JobId, Configuration] = {}
    running: list[Running] = []
    for jid, job in jobs.items():
        cur = job.current
        if job.phase != "running" or cur is None or not cur.total_gpus:
            continue
        if snapshot.first_plan:
            if not fits(cur, avail):
                continue
            take(avail, cur)
            kept[jid] = cur
        ran = job.attained_gpu_s / cur.total_gpus
        running.append(Running(jid, cur, snapshot.now + max(0.0, limits[jid] - ran)))
    return kept, running


def _stats(first: bool, queued: int, out: Outcome) -> PassStats:
    """No solver: the pass's numbers are counts. ``formulation`` names the
    reservation (the head job and its start) and the backfilled jobs."""
    res = out.reservation
    label = "slurm-easy-backfill, reservation="
    label += f"{res.job_id}@{res.start:.0f}s" if res is not None else "none"
    label += f", backfilled={len(out.backfilled)}"
    return PassStats(kind="first" if first else "fill", jobs=queued, variables=0,
                     objective=0.0, bound=0.0, gap=0.0, solve_s=0.0, status="easy-backfill",
                     formulation=label, assigned=tuple(out.started))
