"""The discrete-event simulator (issue: trace-driven comparisons).

A virtual clock moves from event to event — arrivals, profiling runs ending,
jobs finishing, round boundaries — and at each planning point the engine
builds the same :class:`~shared.snapshot.Snapshot` the live scheduler builds
and calls the policy's ``plan``. Jobs progress at the ground truth's rate, the
estimator learns only from what profiling and running jobs report, and a
configuration change costs a checkpoint-restart. Randomness comes from the
seed; wall-clock time only from the injected ``timer``. The events are a
tagged union (``simulator.events``) dispatched with one ``match``; jobs change
phase only through the lifecycle the live scheduler uses too
(``scheduling.lifecycle``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from typing import assert_never

import numpy as np

from estimation.database import ThroughputDatabase
from scheduling import lifecycle as lc
from scheduling.assemble import Holder, assemble
from scheduling.check import plan_overallocation
from scheduling.explain import explain
from scheduling.fairness import raqlr
from scheduling.policy import Policy
from shared import events as ev
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import JobId
from shared.resources import OverAllocation
from shared.reuse import must_profile, profile_signature
from shared.snapshot import Plan, Snapshot
from simulator.cores import Speeds, gpus_short_of_cores
from simulator.events import Arrival, Completion, Event, FillPlan, ProfileEnd, RoundStart
from simulator.forecasting import Forecasting
from simulator.measuring import Measuring
from simulator.metrics import RUNNING, RoundRecord, SimResult, job_outcome
from simulator.settings import SimSettings as SimSettings
from simulator.state import JobRecord, Occupancy, job_holder
from simulator.workloads import SimJob
from world.restarts import restart_cost
from world.truth import GroundTruth

Progress = Callable[[float, int, int], None]
EPS = 1e-6


class Simulation(Measuring, Forecasting):
    """One run of one policy over one workload on one cluster."""

    def __init__(
        self,
        cluster: Cluster,
        jobs: Sequence[SimJob],
        policy: Policy,
        truth: GroundTruth,
        settings: SimSettings | None = None,
        timer: Callable[[], float] | None = None,
    ) -> None:
        self.cluster, self.policy, self.truth = cluster, policy, truth
        self.settings = settings or SimSettings()
        self.timer = timer
        self.rngs: dict[JobId, np.random.Generator] = {}
        uniform = self.settings.restart_s
        self.jobs = {j.spec.id: JobRecord(spec=j.spec, model=j.model, restart_s=(
            restart_cost(j.model) if uniform is None else uniform)) for j in jobs}
        if len(self.jobs) != len(jobs):
            raise ValueError("workload has duplicate job ids")
        self.arrivals = sorted(jobs, key=lambda j: (j.spec.submit_time, j.spec.id))
        self.next_arrival = 0
        # Arrived and unfinished jobs, in workload order: only they change
        # between events, so a long trace costs per event what its live jobs do.
        self.live: dict[JobId, JobRecord] = {}
        self._order = {j.spec.id: i for i, j in enumerate(jobs)}
        self.occ = Occupancy(cluster)
        self.profiling: list[ProfileEnd] = []  # a heap: the runs in flight
        self.db = ThroughputDatabase(reuse=self.settings.profile_reuse)
        self.estimates: dict[JobId, JobEstimate] = {}
        self.dirty: set[JobId] = set()
        self.speeds = Speeds(cluster, truth)
        self.now = 0.0
        self.next_round = 0.0
        self.fill_at: float | None = None
        self.wake = 0.0  # seconds after the last plan that it asked for another
        self.rounds: list[RoundRecord] = []
        self.plan_seconds: list[float] = []
        self.finished: list[tuple[float, float]] = []
        self.done = 0
        self._arrived = False  # jobs arrived since ``live`` was last put in workload order
        # Each stateful layer's state after the last plan (LayerRecord.state),
        # handed to the next plan as the live leader does from KV.
        self.layer_state: dict[str, bytes] = {}
        # Each job's reason codes as they changed, plan by plan (RUNNING
        # while a plan runs it): SimResult.reasons.
        self.reasons: dict[JobId, list[tuple[float, str]]] = {}

    # ------------------------------------------------------------ main loop

    def run(self, progress: Progress | None = None) -> SimResult:
        total = len(self.jobs)
        while self.done < total and self.now < self.settings.max_time_s:
            pending = self._pending()
            t = max(self.now, min(e.at for e in pending))
            finishing = [e for e in pending if isinstance(e, Completion) and e.at <= t + EPS]
            for rec in self.live.values():
                rec.advance(self.now, t, self.cluster)
            self.now = t
            changed = False  # GPUs released or jobs arrived: a plan within the round
            for event in self._due(finishing):
                changed = self._handle(event) or changed
            if self._arrived:
                self.live = dict(sorted(self.live.items(), key=lambda kv: self._order[kv[0]]))
                self._arrived = False
            if changed:  # a wake-up (Plan.wake_after_s) may be set later than this
                due = self.now + self.settings.fill_delay_s
                self.fill_at = due if self.fill_at is None else min(self.fill_at, due)
            for event in self._plans_due():
                self._handle(event)
            if progress is not None:
                progress(self.now, self.done, total)
        r_num = self.settings.r_num
        outcomes = tuple(job_outcome(r, self.truth, self.cluster, r_num)
                         for r in self.jobs.values())
        return SimResult(outcomes, tuple(self.rounds), tuple(self.plan_seconds), self.now,
                         reasons={j: tuple(h) for j, h in self.reasons.items()},
                         forecasts=self._forecast_records())

    def _pending(self) -> list[Event]:
        """The next event of each kind (each running job's completion)."""
        pending: list[Event] = [RoundStart(at=self.next_round)]
        if self.fill_at is not None:
            pending.append(FillPlan(at=self.fill_at))
        if self.next_arrival < len(self.arrivals):
            spec = self.arrivals[self.next_arrival].spec
            pending.append(Arrival(at=spec.submit_time, job_id=spec.id))
        if self.profiling:
            pending.append(self.profiling[0])
        pending += [
            Completion(at=r.completion_time(self.now), job_id=r.id) for r in self._running()
        ]
        return pending

    def _due(self, finishing: Sequence[Completion]) -> Iterator[Event]:
        """The events at ``now``, in the order they apply (simulator.events).
        Lazy: a profiling run's end asks whether others of its job are still
        in flight, so the next is taken off the heap only after it applied."""
        yield from finishing
        while self.profiling and self.profiling[0].at <= self.now + EPS:
            yield heapq.heappop(self.profiling)
        while (
            self.next_arrival < len(self.arrivals)
            and self.arrivals[self.next_arrival].spec.submit_time <= self.now + EPS
        ):
            spec = self.arrivals[self.next_arrival].spec
            self.next_arrival += 1
            yield Arrival(at=spec.submit_time, job_id=spec.id)

    def _plans_due(self) -> Iterator[Event]:
        """A round's first plan, or else a plan later in the round that is due."""
        if self.now >= self.next_round - EPS:
            yield RoundStart(at=self.next_round)
        elif self.fill_at is not None and self.now >= self.fill_at - EPS:
            yield FillPlan(at=self.fill_at)

    def _handle(self, event: Event) -> bool:
        """Apply one event; whether it released GPUs or added a job."""
        match event:
            case Completion(job_id=job_id):
                self._complete(self.jobs[job_id])
                return True
            case ProfileEnd():
                self._end_profiling(event)
                return True
            case Arrival(job_id=job_id):
                self._arrive(self.jobs[job_id])
                return True
            case RoundStart():
                self._round()
                self.fill_at = self._woken()
                return False
            case FillPlan():
                self._plan(first=False)
                self.fill_at = self._woken()
                return False
            case _:
                assert_never(event)

    def _woken(self) -> float | None:
        """A later plan a layer asked for (``Plan.wake_after_s``), if any."""
        wake, self.wake = self.wake, 0.0
        return self.now + wake if wake > 0 else None

    def _move(self, rec: JobRecord, event: lc.Transition) -> None:
        """Move ``rec`` through the one lifecycle; a refusal here is an engine bug."""
        outcome = rec.move(event)
        if isinstance(outcome, lc.Refused):
            raise RuntimeError(f"job {rec.id}: {type(event).__name__} refused: {outcome.reason}")

    def _running(self) -> list[JobRecord]:
        return [r for r in self.live.values() if r.phase == "running"]

    # --------------------------------------------------------------- events

    def _arrive(self, rec: JobRecord) -> None:
        if rec.spec.kind == "cpu":  # nothing to profile: it waits for cores
            self._move(rec, ev.JobSubmitted(job_id=rec.id, spec=rec.spec, at=self.now))
            self._move(rec, lc.Queue(job_id=rec.id, at=self.now))
            self.live[rec.id] = rec
            self._arrived = True
            return
        supported = [
            t.name for t in self.cluster.gpu_types if self.truth.supports(rec.model, t.name)
        ]
        if not supported:
            raise ValueError(f"job {rec.id}: model {rec.model} runs on no GPU type here")
        rec.signature = profile_signature(rec.spec)
        rec.unprofiled = set(must_profile(supported, self.db.shared_types(rec.signature)))
        self._move(rec, ev.JobSubmitted(job_id=rec.id, spec=rec.spec, at=self.now))
        if rec.unprofiled:
            self._move(rec, lc.Profile(job_id=rec.id, at=self.now))
        else:  # its signature was profiled on every type it runs on
            self._move(rec, lc.Queue(job_id=rec.id, at=self.now))
            rec.profile_end = self.now
        self.live[rec.id] = rec
        self._arrived = True

    def _complete(self, rec: JobRecord) -> None:
        assert rec.current is not None
        self.occ.give(job_holder(rec.id), self.occ.jobs)
        rec.done_samples = float(rec.spec.total_samples)
        # Finished: out of the scheduler's hands, its finish time in its life.
        self._move(rec, ev.JobFinished(job_id=rec.id, at=self.now))
        rec.rate = 0.0
        self.done += 1
        del self.live[rec.id]
        self.db.forget(rec.id)
        self.estimates.pop(rec.id, None)
        outcome = job_outcome(rec, self.truth, self.cluster, self.settings.r_num)
        self.finished.append((self.now, outcome.lr))
        self._forecast_resolved(rec, finished=True)
        self.speeds.contend(self._running())

    # -------------------------------------------------------------- planning

    def _round(self) -> None:
        self._sample_running()
        planned = self._plan(first=True)
        # Unassigned jobs (§4.2's fragments): queued without GPUs after planning.
        waiting = sum(1 for r in self.live.values() if r.phase == "queued")
        gpu_waiting = any(r.phase == "queued" and r.spec.kind != "cpu" for r in self.live.values())
        idle = self.occ.idle()
        self.rounds.append(
            RoundRecord(
                t=self.now,
                idle=idle,
                waiting=waiting,
                frag=idle if waiting else 0,
                running=len(self._running()),
                throughput=sum(r.rate for r in self._running()),
                planner_s=planned,
                raqlr=raqlr(self._recent_finished(), self.now, self.settings.raqlr_window_h),
                short_of_cores=gpus_short_of_cores(
                    self.cluster, {s.id: self.occ.used(s.id) for s in self.cluster.servers},
                    self.occ.extras)
                if gpu_waiting and any(s.cores for s in self.cluster.servers) else 0,
            )
        )
        self.next_round = self.now + self.settings.round_s

    def _recent_finished(self) -> list[tuple[float, float]]:
        """The finished jobs inside the RAQLR window (Eq. 7). ``finished`` is
        in time order, so the window is its tail: the whole list, read every
        round, made long traces quadratic."""
        horizon = self.now - self.settings.raqlr_window_h * 3600.0
        return self.finished[bisect.bisect_left(self.finished, (horizon, -math.inf)):]

    def _plan(self, first: bool) -> float:
        """Call the policy and apply its plan; returns the planner's time."""
        active = list(self.live.values())
        if not active:
            return 0.0
        self._queue_without_busy_types(active)
        # A profiling run holds its GPU apart from its job's state. Every job
        # is shown: CPU jobs to every policy, as the simulator always did
        # (plans_cores), and every running GPU job has an estimate (_estimates).
        snap = assemble(
            self.now, self.cluster,
            [Holder(r.state(), r.current if r.phase == "running" else None) for r in active],
            self._estimates(active), first_plan=first, plans_cores=True,
            pinned_gpus=self.occ.profiling, profiling=self.occ.profiling,
            layer_state=self.layer_state, bandwidth_gbps=self.speeds.bandwidth,
        ).snapshot
        start = self.timer() if self.timer else 0.0
        plan = self.policy.plan(snap)
        spent = (self.timer() - start) if self.timer else 0.0
        self.plan_seconds.append(spent)
        why = plan_overallocation(snap, plan)
        if why is not None:
            raise OverAllocation(f"{self.policy.name}: the plan over-allocates: {why}")
        self._record_reasons(snap, plan)
        self._apply(plan, first)
        if first:
            self._forecast(snap, plan, len(self.rounds))
        self.speeds.contend(self._running())
        self.wake = plan.wake_after_s
        self.layer_state = {r.name: r.state for r in plan.reasons.layers if r.state}
        return spent

    def _record_reasons(self, snap: Snapshot, plan: Plan) -> None:
        """Each job's reason in this plan (scheduling.explain, on the
        snapshot the policy planned), kept where its code changed."""
        whys = explain(snap, plan, next_plan_at=self.next_round, r_num=self.settings.r_num)
        for job in snap.jobs:
            why = whys.get(job.id)
            code = why.code if why is not None else RUNNING
            history = self.reasons.setdefault(job.id, [])
            if not history or history[-1][1] != code:
                history.append((self.now, code))

    def _apply(self, plan: Plan, first: bool) -> None:
        chosen = {a.job_id: a.config for a in plan.assignments}
        if len(chosen) != len(plan.assignments):
            raise RuntimeError(f"{self.policy.name}: a job got two configurations")
        if first:
            for rec in self._running():
                config = chosen.get(rec.id)
                if config is None or rec.current is None or \
                        config.parts != rec.current.parts:
                    self._stop(rec)
        # In-place changes that give cores back go first: the plan fits as a
        # whole, and the cores they free may be what the others take.
        for job_id, config in sorted(chosen.items(), key=lambda kv: not self._shrinks(*kv)):
            self._start(self.jobs[job_id], config)
        for task in plan.profiling:
            self._profile(task.job_id, task.gpu_type, task.server)

    def _shrinks(self, job_id: JobId, config: Configuration) -> bool:
        cur = self.jobs[job_id].current
        return cur is not None and cur.parts == config.parts and all(
            config.cores_on(s) <= cur.cores_on(s) for s in cur.servers)

    def _stop(self, rec: JobRecord) -> None:
        assert rec.current is not None
        self.occ.give(job_holder(rec.id), self.occ.jobs)
        self._move(rec, ev.JobStopped(job_id=rec.id, at=self.now))
        rec.rate = 0.0

    def _start(self, rec: JobRecord, config: Configuration) -> None:
        if rec.phase == "running" and rec.current == config:
            return
        if rec.phase == "running" and rec.current is not None and \
                rec.current.parts == config.parts:
            self._retune(rec, config)
            return
        if rec.phase != "queued":
            raise RuntimeError(f"{self.policy.name}: job {rec.id} is {rec.phase}, not queued")
        if config.total_gpus not in rec.spec.requirement_set(self.settings.r_num) and not (
                rec.spec.kind == "cpu" and config.total_gpus == 0):
            raise RuntimeError(f"{self.policy.name}: {config} is not a requirement of {rec.id}")
        self.occ.take(job_holder(rec.id), config, self.occ.jobs)
        # Every start is a checkpoint-restart (the lifecycle counts it).
        self._move(rec, ev.JobStarted(job_id=rec.id, configuration=config, at=self.now))
        self.speeds.set(rec, config, self.now)
        rec.paused_until = self.now + rec.restart_s
        self._forecast_resolved(rec, finished=False)

    def _retune(self, rec: JobRecord, config: Configuration) -> None:
        """The same GPUs, other cores: changed in place, no restart."""
        self.occ.give(job_holder(rec.id), self.occ.jobs)
        self.occ.take(job_holder(rec.id), config, self.occ.jobs)
        self._move(rec, lc.Retune(job_id=rec.id, configuration=config, at=self.now))
        self.speeds.set(rec, config, self.now)
        rec.retunes += 1

