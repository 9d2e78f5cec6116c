"""The Gavel baseline (Narayanan et al., "Heterogeneity-Aware Cluster
Scheduling Policies for Deep Learning Workloads", OSDI'20) behind the
``plan(snapshot) -> Plan`` protocol, configured as the Hops paper (SoCC'24,
§4.2 "Baseline Settings") runs it.

One first plan of a round:

1. the profiling queue has taken GPUs first, as in every policy here (§3.2):
   the registry wraps the policy in the profiling-first layer
   (:mod:`scheduling.layers.profiling_first`);
2. each job gets a rigid size, the (lower) median of its requirement set —
   Gavel has no elastic requirements, so Hops fixes the median;
3. the throughput matrix ``T[j][t]`` is read off the estimator's per-type
   curves at that size (per-server curves are ignored: Gavel's heterogeneity
   stops at the GPU type);
4. the allocation LP (:mod:`.lp`): heterogeneity-aware max-min fairness
   over time fractions ``X[j][t]`` with scale factors, each job's normalised
   effective throughput divided by its priority weight. The weights are the
   Hops queue priorities (latency ratio by default, Hops §4.2: "the same
   latency ratio priority as Hops for the queuing priorities of both the Sia
   and Gavel") passed through the bias rule of Eq. (11), ``(prior + bias)^lam``;
   ``lam = 0`` gives Gavel's unweighted max-min;
5. the round (:mod:`.rounds`): priorities ``X / received fraction``,
   selection in that order with the queue priority breaking ties, and
   placement on concrete servers, running jobs kept where they are.

Later plans of a round plan nothing (the layer still serves the profiling
queue): Gavel plans once per round (Hops §3.6). The allocation is recomputed every round because the
latency-ratio weights change every round; Gavel recomputes it when jobs
arrive or leave, at most once per ``minimum_time_between_allocation_resets``.
The round length (Gavel's ``time_per_iteration``, 360 s) is the runner's.

Read in stanford-futuredata/gavel: ``scheduler/policies/policy.py``,
``max_min_fairness.py``, ``max_min_fairness_water_filling.py``,
``proportional.py``, ``finish_time_fairness.py`` and ``scheduler/scheduler.py``
(``_update_priorities``, ``_schedule_jobs_on_workers_helper``,
``_schedule_jobs_on_workers``, ``_assign_workers_to_job``). The mapping is
written out in docs/baselines.md, section "Gavel".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from scheduling.ilp import MipOptions
from scheduling.layers.base import LayeredPolicy
from scheduling.policies.gavel.lp import (
    Allocation,
    LpJob,
    fastest_first,
    max_min_allocation,
    rigid_requirement,
    type_throughput,
)
from scheduling.policies.gavel.rounds import (
    Entry,
    Placed,
    place_type,
    queue_order,
    round_priority,
    select,
)
from scheduling.priorities import latency_ratios, priority_fn, queue_priorities, weights
from scheduling.profiling import PROFILE_PREEMPT, PROFILE_SHARE
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, config_throughput
from shared.ids import GpuType, JobId, ServerId
from shared.job import R_NUM
from shared.reuse import BASELINE_PROFILE_REUSE
from shared.snapshot import Assignment, JobState, PassStats, Plan, PlanReasons, Snapshot

_MIP = MipOptions()  # the solver's defaults are Gavel's
SkipReason = Literal["no_throughput", "no_room", "unplaceable"]


class GavelSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Operator knobs. ``priority`` and ``lam`` weight the LP as in Hops'
    Eq. (11); ``global_queue`` is Gavel's ``enable_global_queue``."""

    priority: str = "lr"
    lam: float = 1.0
    r_num: int = R_NUM
    global_queue: bool = False
    time_limit_s: float = _MIP.time_limit_s
    threads: int = _MIP.threads
    # The profiling-first layer's knobs (layers/profiling_first.py), set per
    # policy spec; Gavel itself does not read them.
    profile_gpus: int = 1
    profile_share: float = PROFILE_SHARE  # of each GPU type, at once (profiling.py)
    profile_preempt: bool = PROFILE_PREEMPT  # at round boundaries (profiling.py)
    # Jobs of one profile signature share profiles (shared.reuse).
    profile_reuse: bool = BASELINE_PROFILE_REUSE


class GavelRound(msgspec.Struct, frozen=True):
    """A plan with what led to it: rigid sizes, the LP's ``X``, the round
    priorities, and why each planned job got nothing (``no_throughput``: no
    type can run its rigid size; ``no_room``: never fit the GPUs left when its
    turn came; ``unplaceable``: selected, but no placement with throughput)."""

    plan: Plan
    rigid: dict[JobId, int] = {}
    allocation: dict[JobId, dict[GpuType, float]] = {}
    round_priority: dict[JobId, dict[GpuType, float]] = {}
    skipped: dict[JobId, SkipReason] = {}


class GavelPolicy(LayeredPolicy):
    """Gavel's heterogeneity-aware max-min fairness, realised in rounds."""

    name = "gavel"

    def __init__(self, settings: GavelSettings | None = None) -> None:
        self.settings = settings or GavelSettings()
        self._priority = priority_fn(self.settings.priority)

    def plan_inner(self, snapshot: Snapshot) -> Plan:
        return self.decide(snapshot).plan

    def decide(self, snapshot: Snapshot) -> GavelRound:
        """:meth:`plan_inner` with its workings, for tests and logs (the
        layers' work, profiling included, is not in it)."""
        free = snapshot.free_gpus()
        if not snapshot.first_plan:
            return GavelRound(Plan(reasons=PlanReasons(self.name)))
        jobs = _plannable(snapshot)
        ests = {jid: _by_type(snapshot.estimates[jid]) for jid in jobs}
        rigid = {jid: rigid_requirement(j.spec, self.settings.r_num) for jid, j in jobs.items()}
        prios = self._queue_priorities(snapshot, jobs, ests)
        capacity = snapshot.cluster.free_by_type(free)
        lp_jobs = self._lp_jobs(snapshot.cluster, ests, rigid, prios, capacity)
        options = MipOptions(time_limit_s=self.settings.time_limit_s, threads=self.settings.threads)
        alloc = max_min_allocation(lp_jobs, capacity, options)
        entries = _entries(jobs, alloc, prios, snapshot.now)
        types = fastest_first(lp_jobs, list(capacity))
        chosen = select(queue_order(entries, types, self.settings.global_queue), rigid, capacity)
        placed = _place(snapshot.cluster, chosen, jobs, rigid, ests, free)
        assignments = tuple(
            Assignment(jid, cfg, tput, alloc.fractions[jid][t])
            for t in types
            for jid, (cfg, tput) in placed[t].items()
        )
        skipped = _skips(jobs, entries, chosen, {a.job_id for a in assignments})
        reasons = PlanReasons(
            policy=self.name,
            priorities=prios,
            latency_ratios=latency_ratios(snapshot, jobs, self.settings.r_num, ests),
            passes=(_stats(len(jobs), alloc, assignments, skipped),),
        )
        return GavelRound(
            plan=Plan(assignments, (), reasons),
            rigid=rigid,
            allocation=alloc.fractions,
            round_priority=_by_job(entries),
            skipped=skipped,
        )

    def _queue_priorities(
        self,
        snapshot: Snapshot,
        jobs: Mapping[JobId, JobState],
        ests: Mapping[JobId, JobEstimate],
    ) -> dict[JobId, float]:
        # The same facts and priority function as the Hops planner, so the
        # baseline queues by the latency ratio exactly as Hops does.
        return queue_priorities(snapshot, jobs, self._priority, self.settings.r_num, ests)

    def _lp_jobs(
        self,
        cluster: Cluster,
        ests: Mapping[JobId, JobEstimate],
        rigid: Mapping[JobId, int],
        prios: Mapping[JobId, float],
        capacity: Mapping[GpuType, int],
    ) -> list[LpJob]:
        """Gavel's throughput matrix at the rigid sizes, with the weights of
        Eq. (11) as its priority weights."""
        w = weights(prios, self.settings.lam)
        return [
            LpJob(
                jid,
                rigid[jid],
                w[jid],
                {t: type_throughput(est, cluster, t, rigid[jid]) for t in capacity},
            )
            for jid, est in ests.items()
        ]


def _place(
    cluster: Cluster,
    chosen: Mapping[GpuType, Sequence[JobId]],
    jobs: Mapping[JobId, JobState],
    rigid: Mapping[JobId, int],
    ests: Mapping[JobId, JobEstimate],
    free: Mapping[ServerId, int],
) -> dict[GpuType, dict[JobId, Placed]]:
    """Phase 2 of the round on every type; throughputs from the type curves."""

    def rate(jid: JobId, config: Configuration) -> float:
        return config_throughput(ests[jid], cluster, config)

    avail = dict(free)
    out: dict[GpuType, dict[JobId, Placed]] = {}
    for t, ids in chosen.items():
        per_type = place_type(cluster, t, ids, jobs, rigid, avail, rate)
        out[t] = {jid: p for jid, p in per_type.items() if p is not None}
    return out


def _stats(
    considered: int,
    alloc: Allocation,
    assignments: Sequence[Assignment],
    skipped: Mapping[JobId, SkipReason],
) -> PassStats:
    """The LP is solved to optimality: bound = objective, gap 0. Jobs selected
    but left without servers are named in ``formulation``, as Sia's pass does,
    since PlanReasons has no field for them."""
    unplaced = sorted(j for j, why in skipped.items() if why == "unplaceable")
    label = f"gavel-max-min-lp, unplaced={len(unplaced)}"
    if unplaced:
        label += f" ({', '.join(unplaced)})"
    return PassStats(
        kind="first",
        jobs=considered,
        variables=alloc.columns,
        objective=alloc.objective,
        bound=alloc.objective,
        gap=0.0,
        solve_s=alloc.solve_s,
        status=alloc.status,
        formulation=label,
        assigned=tuple(a.job_id for a in assignments),
    )


def _plannable(snapshot: Snapshot) -> dict[JobId, JobState]:
    """Waiting and running jobs with an estimate, in id order (a first plan
    replans every running job)."""
    ready = [
        j for j in snapshot.jobs if j.phase in ("queued", "running") and j.id in snapshot.estimates
    ]
    return {j.id: j for j in sorted(ready, key=lambda j: j.id)}


def _by_type(est: JobEstimate) -> JobEstimate:
    """The estimate Gavel can know: type curves only, server entities dropped."""
    return JobEstimate(job_id=est.job_id, by_type=est.by_type)


def _entries(
    jobs: Mapping[JobId, JobState],
    alloc: Allocation,
    prios: Mapping[JobId, float],
    now: float,
) -> list[Entry]:
    """One round entry per (job, type) the LP could give time to."""
    return [
        Entry(
            jid,
            t,
            round_priority(job, t, alloc.fractions[jid][t], now),
            prios[jid],
            alloc.fractions[jid][t],
            job.spec.submit_time,
        )
        for jid, job in jobs.items()
        for t in alloc.runnable[jid]
    ]


def _by_job(entries: Sequence[Entry]) -> dict[JobId, dict[GpuType, float]]:
    out: dict[JobId, dict[GpuType, float]] = {}
    for e in entries:
        out.setdefault(e.job_id, {})[e.gpu_type] = e.priority
    return out


def _skips(
    jobs: Mapping[JobId, JobState],
    entries: Sequence[Entry],
    chosen: Mapping[GpuType, Sequence[JobId]],
    assigned: set[JobId],
) -> dict[JobId, SkipReason]:
    candidates = {e.job_id for e in entries}
    selected = {j for ids in chosen.values() for j in ids}
    out: dict[JobId, SkipReason] = {}
    for jid in jobs:
        if jid in assigned:
            continue
        if jid not in candidates:
            out[jid] = "no_throughput"
        else:
            out[jid] = "unplaceable" if jid in selected else "no_room"
    return out
