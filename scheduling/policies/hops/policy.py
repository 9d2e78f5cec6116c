"""The Hops policy: one planning call of §3.6 as a pure function of a snapshot.

Order of work in a call:

1. the profiling queue has taken GPUs first (§3.2): the registry wraps the
   policy in the profiling-first layer
   (:mod:`scheduling.layers.profiling_first`), so the snapshot this
   policy sees holds the profiling runs' GPUs;
2. at the start of a round, the *first plan*: priorities, the service window
   over all GPUs, and the prior-weighted ILP of Eq. (11)-(13);
3. *fill plans* over whatever is still idle — fragments, or GPUs released
   later in the round — each with a window over the idle GPUs and the
   sensitivity adjustment, until nothing more fits. Their assignments end with
   the round, like the first plan's.

Departure (``HopsSettings.preempt_margin``, docs/design.md "Hysteresis"): in
a first plan a running job's current configuration weighs a margin more in
Eq. (11) and it joins a pass's window when that margin could keep it, so a
waiting job preempts it only for a gain beyond the margin. Under the
latency ratio a waiting job's priority grows while a running one's stays;
the paper's rule made jobs of nearly equal priorities trade places at every
first plan (a burst of short jobs over long ones: up to 46 restarts of a
long job, docs/results.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from scheduling.layers.base import LayeredPolicy
from scheduling.policies.hops.exempt import exempt, kept, without_exempt
from scheduling.policies.hops.passes import (
    WEIGHT_FLOOR,
    PassJob,
    PassResult,
    SolverSettings,
    greedy_pass,
    solve_pass,
)
from scheduling.policies.hops.reconfig import HORIZONS, horizon, reconfig_cost
from scheduling.policies.hops.reserve import backfill, head_reservation
from scheduling.policies.hops.steady import Room, keep_in_place, unplaceable, without
from scheduling.policies.hops.window import (
    QueueEntry,
    order_queue,
    sensitivity_adjustment,
    service_window,
)
from scheduling.priorities import latency_ratios, priority_fn, queue_priorities, weights
from scheduling.profiling import PROFILE_PREEMPT, PROFILE_SHARE
from scheduling.rounds import ROUND_S, restart_cost
from shared.estimate import job_sensitivity, sensitivity
from shared.ids import JobId, ServerId
from shared.job import R_NUM
from shared.reuse import PROFILE_REUSE
from shared.snapshot import (
    Assignment,
    JobState,
    PassStats,
    Plan,
    PlanReasons,
    Snapshot,
)

# The solver's defaults are the planner's: one definition of each knob.
_SOLVER = SolverSettings()


class HopsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Operator knobs. ``lam`` is Eq. (11)'s lambda (``inf`` = greedy order)."""

    # The queue's order and the ILP's weights (Eq. 11's prior_i). The paper's
    # is ``lr`` (Eq. 8); this project's default keeps it as a guard and
    # orders the jobs below it shortest-remaining-first on the same scale
    # (scheduling.priorities.guarded_delay; docs/results.md, "Issue 38:
    # the default"); ``hops-paper`` keeps ``lr``.
    priority: str = "guarded-delay"
    lam: float = 1.0
    sigma: float = _SOLVER.sigma
    r_num: int = R_NUM
    mip_rel_gap: float = _SOLVER.mip_rel_gap
    time_limit_s: float = _SOLVER.time_limit_s
    # A start within accept_gap of the LP bound is accepted without branch
    # and bound (scheduling.policies.hops.proof.settled).
    accept_gap: float = _SOLVER.accept_gap
    threads: int = _SOLVER.threads
    direct_max_columns: int = _SOLVER.direct_max_columns
    max_fill_passes: int = 4
    # A fragment plan's window skips jobs no configuration on the free GPUs
    # could serve (this project's filter; False: the paper's window over
    # every waiting job, docs/baselines.md "Hops variants").
    fill_filter: bool = True
    # The profiling-first layer's knobs (layers/profiling_first.py), set per
    # policy spec; the planner itself does not read them.
    profile_gpus: int = 1
    profile_share: float = PROFILE_SHARE  # of each GPU type, at once (profiling.py)
    profile_preempt: bool = PROFILE_PREEMPT  # at round boundaries (profiling.py)
    # Jobs of one profile signature share profiles (shared.reuse).
    profile_reuse: bool = PROFILE_REUSE
    # Share of its gain a configuration change costs a job: options that
    # would restart it weigh this much less, so it is moved only when the new
    # placement pays for the restart (scheduling.policies.hops.reconfig).
    # None: its restart cost over ``reconfig_horizon``; a number, the same
    # for every job (0: the paper, which charges nothing).
    reconfig_cost: float | None = None
    reconfig_horizon: str = "remaining"
    # A running job keeps its configuration at a first plan until it has
    # run this many times its restart cost since it last (re)started
    # (scheduling.policies.hops.exempt, Slurm's PreemptExemptTime); 0: the
    # paper, every running job replanned.
    preempt_exempt: float = 10.0
    # Hysteresis at first plans (a departure, docs/design.md "Hysteresis"):
    # a running job's current configuration is worth this share of the
    # queue's highest Eq. (11) weight more (PassJob.keep_bonus), and it
    # joins the window when that can keep it (_running_too), so a waiting job
    # takes its GPUs only when its weighted gain beats the running job's by
    # more than that.
    # Above the latency-ratio differences between jobs far below the
    # queue's head, below the 5% speed-up a job alone may move for
    # (tests/test_planner.py); docs/results.md measures 0 to 0.1. 0: the paper.
    preempt_margin: float = 0.02
    # Issue 38's departures from Eq. (11) (docs/results.md, "Issue 38");
    # move_min_gain and keep_in_place_partial are on by default (measured
    # with guarded-delay, "Issue 38: the default"), the others off:
    # - gain_per_gpu: an option's speed-up (G_ij - 1) counts once per GPU of
    #   the job's smallest request R_1, so the ILP weighs speed-ups across
    #   jobs by the GPUs they make faster (Eq. 11 counts G_ij once per job:
    #   a 64-GPU job 11% faster weighs as one 1-GPU job 11% faster);
    # - move_min_gain: a running job is moved to another configuration of
    #   its GPU count for its own sake only when the move is estimated this
    #   share faster (Eq. 11 moves it for any gain above its switch factor);
    #   such a move weighs at most 1 - move_min_gain of staying;
    # - keep_in_place_partial: a job the ILP keeps at its server class and
    #   shape keeps its exact servers, taken before the other jobs of the
    #   class are placed (the class formulation's realisation, §3.6, may
    #   otherwise put it on a twin server: a restart for nothing).
    # - reserve_head: EASY backfill in the fill passes (§3.6 gives freed
    #   GPUs to whatever fits now): the highest-priority waiting job that
    #   does not fit reserves the GPU type that frees enough GPUs soonest,
    #   and other jobs may start there only if estimated to end by then
    #   (scheduling.policies.hops.reserve).
    # - finish_exempt: a running job estimated to end sooner than a
    #   preemption would cost it (its restart and a round's re-wait) keeps
    #   its configuration at a first plan (scheduling.policies.hops.exempt).
    gain_per_gpu: bool = _SOLVER.gain_per_gpu
    move_min_gain: float = _SOLVER.move_min_gain
    keep_in_place_partial: bool = _SOLVER.keep_in_place_partial
    reserve_head: bool = False
    finish_exempt: bool = False

    def __post_init__(self) -> None:
        if self.reconfig_horizon not in HORIZONS:
            raise ValueError(f"reconfig_horizon must be one of {', '.join(HORIZONS)}, "
                             f"got {self.reconfig_horizon!r}")
        if self.preempt_margin < 0:
            raise ValueError(f"preempt_margin must be >= 0, got {self.preempt_margin}")
        if self.preempt_exempt < 0:
            raise ValueError(f"preempt_exempt must be >= 0, got {self.preempt_exempt}")
        if not 0.0 <= self.move_min_gain < 1.0:
            raise ValueError(f"move_min_gain must lie in [0, 1), got {self.move_min_gain}")
        if self.reconfig_cost is not None and not 0.0 <= self.reconfig_cost <= 1.0:
            raise ValueError(f"reconfig_cost must lie in [0, 1], got {self.reconfig_cost}")

    def solver(self) -> SolverSettings:
        return SolverSettings(
            sigma=self.sigma,
            mip_rel_gap=self.mip_rel_gap,
            time_limit_s=self.time_limit_s,
            accept_gap=self.accept_gap,
            threads=self.threads,
            direct_max_columns=self.direct_max_columns,
            greedy=math.isinf(self.lam),
            gain_per_gpu=self.gain_per_gpu,
            move_min_gain=self.move_min_gain,
            keep_in_place_partial=self.keep_in_place_partial,
        )


class _Queue(msgspec.Struct, frozen=True):
    """Plannable jobs of one call, in priority order."""

    order: tuple[JobId, ...]
    priorities: dict[JobId, float]
    entries: dict[JobId, QueueEntry]
    jobs: dict[JobId, JobState]


class HopsPolicy(LayeredPolicy):
    """Latency-ratio-fair, heterogeneity-aware planning (the paper's scheduler)."""

    name = "hops"

    def __init__(self, settings: HopsSettings | None = None) -> None:
        self.settings = settings or HopsSettings()
        self._priority = priority_fn(self.settings.priority)

    def plan_inner(self, snapshot: Snapshot) -> Plan:
        everyone = {j.id: j for j in snapshot.jobs}
        staying = exempt(snapshot, self.settings.preempt_exempt, self.settings.finish_exempt)
        stays = kept(snapshot, staying)
        snapshot = without_exempt(snapshot, staying)
        free = snapshot.free_gpus()
        left_out = unplaceable(snapshot, free, self.settings.r_num, self.settings.sigma)
        full, snapshot = snapshot, without(snapshot, left_out)
        queue = self._queue(snapshot)
        pool = dict(free)  # what the passes share
        assignments: list[Assignment] = []
        passes: list[PassStats] = []
        admitted: list[JobId] = []
        first_window: tuple[JobId, ...] = ()
        pending = list(queue.order)
        kind: Literal["first", "fill"] = "first" if snapshot.first_plan else "fill"
        view: Snapshot | None = None  # the fill passes' view (reserve_head)
        for _ in range(1 + self.settings.max_fill_passes):
            if not pending or sum(free.values()) == 0:
                break
            if kind == "fill" and view is None:
                view = self._backfill(full, snapshot, queue, everyone, pending, free,
                                      [*stays, *assignments])
            seen = view if view is not None else snapshot
            window, extra = self._members(seen, queue, pending, free, kind)
            window = self._running_too(queue, pending, window, extra, snapshot.first_plan)
            first_window = first_window or tuple(e.job_id for e in window)
            admitted.extend(e.job_id for e in extra)
            result = self._solve(seen, queue, [*window, *extra], free)
            passes.append(_stats(kind, len(window) + len(extra), result))
            if not result.choices:
                break
            for c in result.choices:
                assignments.append(Assignment(c.job_id, c.config, c.throughput, c.gain))
                for sid, gpus in c.config.parts:
                    free[sid] -= gpus
            chosen = {c.job_id for c in result.choices}
            pending = [j for j in pending if j not in chosen]
            kind = "fill"
        if snapshot.first_plan:
            assignments = keep_in_place(
                assignments, queue.jobs, snapshot.estimates, snapshot.cluster, pool
            )
        assignments = [*stays, *assignments]
        reasons = PlanReasons(
            policy=self.name,
            unplaceable=left_out,
            priorities=queue.priorities,
            latency_ratios=latency_ratios(snapshot, queue.jobs, self.settings.r_num),
            window=first_window,
            admitted_by_adjustment=tuple(admitted),
            passes=tuple(passes),
        )
        return Plan(tuple(assignments), (), reasons)

    def _backfill(
        self, full: Snapshot, snapshot: Snapshot, queue: _Queue,
        everyone: Mapping[JobId, JobState], pending: Sequence[JobId],
        free: Mapping[ServerId, int], placed: Sequence[Assignment],
    ) -> Snapshot:
        """The snapshot the fill passes see: with ``reserve_head``, the
        head's reserved type gone from the estimates of the jobs that would
        not end there before it is free (scheduling.policies.hops.reserve).
        ``full``: the call's snapshot with the jobs that fit nowhere now,
        which is what a wide head usually is; ``everyone``: every job of the
        call, the exempt ones too."""
        s = self.settings
        if not s.reserve_head:
            return snapshot
        out = {j.id: j for j in full.jobs if j.id in full.estimates and j.id not in queue.jobs
               and j.phase == "queued"}
        prios = {**queue_priorities(full, out, self._priority, s.r_num)} if out else {}
        if pending:
            prios[pending[0]] = queue.priorities[pending[0]]
        if not prios:
            return snapshot
        head = order_queue(prios, {j.id: j.spec.submit_time for j in full.jobs})[0]
        r = head_reservation(full, everyone, head, free, placed, s.r_num, s.sigma)
        if r is None:
            return snapshot
        estimates = backfill(r, snapshot.now, snapshot.cluster, queue.jobs,
                             snapshot.estimates, s.r_num)
        return msgspec.structs.replace(snapshot, estimates=estimates)

    def _queue(self, snapshot: Snapshot) -> _Queue:
        """Jobs this call may plan: with an estimate, and either waiting or —
        at the start of a round — running (every running job is replanned)."""
        phases = {"queued", "running"} if snapshot.first_plan else {"queued"}
        jobs = {j.id: j for j in snapshot.jobs if j.phase in phases and j.id in snapshot.estimates}
        prios = queue_priorities(snapshot, jobs, self._priority, self.settings.r_num)
        order = order_queue(prios, {jid: j.spec.submit_time for jid, j in jobs.items()})
        entries = {
            jid: QueueEntry(
                job_id=jid,
                min_gpus=jobs[jid].spec.requirement_set(self.settings.r_num)[0],
                rho=job_sensitivity(snapshot.estimates[jid], snapshot.cluster),
            )
            for jid in jobs
        }
        return _Queue(tuple(order), prios, entries, jobs)

    def _running_too(
        self, queue: _Queue, pending: Sequence[JobId], window: list[QueueEntry],
        extra: Sequence[QueueEntry], first_plan: bool,
    ) -> list[QueueEntry]:
        """The window and, at a first plan with a keep bonus, the running
        jobs outside it whose weight with the bonus reaches its lowest: left
        out, a running job would lose its GPUs without its bonus being
        weighed, and only such a job could keep them with it (a departure,
        docs/design.md "Hysteresis")."""
        margin = self.settings.preempt_margin
        if not first_plan or margin <= 0 or not window:
            return window
        w = weights(queue.priorities, self._finite_lam)
        inside = {e.job_id for e in (*window, *extra)}
        low = min(w[e.job_id] for e in window)
        return window + [queue.entries[j] for j in pending
                         if j not in inside and queue.jobs[j].phase == "running"
                         and w[j] + margin >= low]

    def _members(
        self,
        snapshot: Snapshot,
        queue: _Queue,
        pending: Sequence[JobId],
        free: Mapping[ServerId, int],
        kind: Literal["first", "fill"],
    ) -> tuple[list[QueueEntry], list[QueueEntry]]:
        """The service window over the GPUs this pass can use and, for a
        fragment plan, the low-sensitivity jobs the adjustment admits."""
        entries = [queue.entries[j] for j in pending]
        capacity = sum(free.values())
        if kind == "first":
            return service_window(entries, capacity), []
        if not self.settings.fill_filter:
            window = service_window(entries, capacity)
            return window, sensitivity_adjustment(entries, window, capacity)
        # A fragment plan's window skips jobs that no configuration on these
        # GPUs could serve: they cannot use the fragments, and letting them
        # fill the window would block the jobs behind them for nothing.
        room = Room(snapshot.cluster, free)
        usable = [
            e
            for e in entries
            if room.admits(
                queue.jobs[e.job_id].spec.requirement_set(self.settings.r_num),
                snapshot.estimates[e.job_id],
                self.settings.sigma,
            )
        ]
        window = service_window(usable, capacity)
        return window, sensitivity_adjustment(usable, window, capacity)

    def _solve(
        self,
        snapshot: Snapshot,
        queue: _Queue,
        members: Sequence[QueueEntry],
        free: Mapping[ServerId, int],
    ) -> PassResult:
        w = weights({e.job_id: queue.priorities[e.job_id] for e in members}, self._finite_lam)
        bonus = self._keep_bonus(queue, w)
        pass_jobs = [self._pass_job(snapshot, queue.jobs[e.job_id], w[e.job_id], bonus)
                     for e in members]
        settings = self.settings.solver()
        if settings.greedy:
            return greedy_pass(snapshot.cluster, free, pass_jobs, settings)
        return solve_pass(snapshot.cluster, free, pass_jobs, settings)

    @property
    def _finite_lam(self) -> float:
        # With lambda = inf the greedy pass uses the order alone; weights are unused.
        return 1.0 if math.isinf(self.settings.lam) else self.settings.lam

    def _reconfig_cost(self, snapshot: Snapshot, job: JobState) -> float:
        s = self.settings
        if s.reconfig_cost is not None:
            return s.reconfig_cost
        span = ROUND_S if s.reconfig_horizon == "round" else horizon(
            job, snapshot.estimates[job.id], snapshot.cluster, ROUND_S,
            job.spec.requirement_set(s.r_num))
        return reconfig_cost(restart_cost(job), span)

    def _keep_bonus(self, queue: _Queue, w: Mapping[JobId, float]) -> float:
        """``preempt_margin`` of the queue's top weight in this pass's
        weights (whose top is 1: the pass's top job over the queue's)."""
        if self.settings.preempt_margin <= 0 or not w:
            return 0.0
        head = max(w, key=lambda j: w[j])
        over_queue = weights(queue.priorities, self._finite_lam)[head]
        return self.settings.preempt_margin / max(over_queue, WEIGHT_FLOOR)

    def _pass_job(self, snapshot: Snapshot, job: JobState, weight: float,
                  bonus: float = 0.0) -> PassJob:
        est = snapshot.estimates[job.id]
        return PassJob(
            job_id=job.id,
            weight=weight,
            requirements=job.spec.requirement_set(self.settings.r_num),
            rho={t: sensitivity(est, t) for t in est.by_type},
            estimate=est,
            current=job.current,
            switch_factor=1.0 - self._reconfig_cost(snapshot, job),
            keep_bonus=bonus if snapshot.first_plan and job.phase == "running" else 0.0,
        )


def _stats(kind: Literal["first", "fill"], considered: int, r: PassResult) -> PassStats:
    return PassStats(
        kind=kind,
        jobs=considered,
        variables=r.columns,
        objective=r.objective,
        bound=r.bound,
        gap=r.gap,
        solve_s=r.solve_s,
        status=r.status,
        formulation=r.formulation,
        assigned=tuple(c.job_id for c in r.choices),
    )
