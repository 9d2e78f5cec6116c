"""The task-level simulator of Hare's evaluation (hare.md §7.1, §7.3): a
relaxed-sync workload run online under any task policy.

Online and honest
-----------------
A job is known only from its arrival. At every distinct arrival time t the
simulator

1. runs the current plan up to t: every task that starts before t starts;
2. keeps the macro-rounds already under way (at least one task started) as
   they were planned, drops every other planned task
   (:func:`scheduling.policies.hare.sequences.keep`), and works out when the
   kept tasks run (nothing they wait for can change any more): their rounds
   are then done for the planner (``fronts``, ``forget``);
3. builds a :class:`~scheduling.policies.hare.model.TaskProblem` of the
   arrived, unfinished jobs, from the first round not under way
   (``done_rounds``), with ``ready_s`` where that round waits for a barrier
   after t and each GPU's ``free_s`` when its last kept task has computed;
4. asks the sequences core (:func:`scheduling.policies.hare.sequences.plan`,
   the live leader's too) for the next revision: it groups the problem into
   macro-tasks (``budget`` tasks at most, since real jobs have 10^4-10^6
   rounds), asks the policy for a schedule, checks it and appends each GPU's
   tasks, in order of planned start, after its kept ones; the simulator
   queues them.

Execution
---------
Each GPU runs its queue in order. A macro-task starts when its GPU is free,
its macro-round's barrier is released (every task of the previous one
computed and synchronised; a job's first round at its arrival) and, for the
job's first macro-round in the plan, not before its planned start: that is
when the policy chose to start (or resume) the job, and a deliberate wait
holds (FIFO's head of line). Started tasks are never preempted. A macro-task standing for n real
rounds of one task slot computes ``n · T^c`` and synchronises ``n · T^s``
on its GPU's type, the job's true per-batch times: the bounded-staleness
reading of a macro-round that :mod:`scheduling.policies.hare.macro` states.
A GPU whose previous task was another job's pays the switch cost
(``switch_s``, hare.md Table 3) before computing; its first task does not.
Truth and plan differ only by the switch cost and by a macro-round's whole
rounds against the macro job's mean.

Horizon
-------
``horizon_rounds`` None (the default) is the paper's offline plan above:
each revision sequences every remaining round of every job. A number H is
the live leader's way (:mod:`scheduling.live.tasks`): a revision sequences
at most H rounds of each job from its first round not under way, and the
simulator also replans at every macro-round's barrier (when the live
aggregator would apply a round and the leader replan), not only at
arrivals. The policy then sees each job as H rounds long. A replan keeps
what the leader keeps (:func:`scheduling.live.tasks.assumed_started`):
besides the tasks started, each GPU's next task of a round whose job's
earlier rounds are synchronised, which the leader cannot tell from a
running one. ``release_s`` delays every barrier past its synchronisation
(the live loop's turnaround; 0 by default).

A job finishes when its last round's barrier passes; JCT is finish minus
arrival. Time is the simulated clock; the planning time is measured with the
injected ``timer`` (none: zero).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from scheduling.live.tasks import LiveTaskSettings, assumed_started
from scheduling.policies.hare.macro import DEFAULT_BUDGET
from scheduling.policies.hare.model import Gpu, GpuId, TaskJob, TaskPolicy, TaskProblem
from scheduling.policies.hare.sequences import (
    Entry,
    EntryKey,
    Sequences,
    empty,
    forget,
    fronts,
    keep,
    plan,
)
from shared.ids import JobId
from simulator.tasks_result import JobOutcome, RunTask, TaskSimResult, summarise
from world.hare import SWITCH_S

Timer = Callable[[], float]


class TaskSimSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``budget``: most macro-tasks per problem; ``switch_s``: the cost of a
    GPU switching jobs; ``check``: test every schedule against the
    constraints; ``record``: keep every executed macro-task in the result;
    ``horizon_rounds``: the most rounds of a job one revision sequences,
    replanning at every barrier (None: all of them, at arrivals only; the
    module docstring's "Horizon"); ``release_s``: how long after a
    macro-round's synchronisation its barrier passes (0: at once, the
    paper's model; the live loop takes the reports' trip, a leader pass and
    the revision's trip)."""

    budget: int = DEFAULT_BUDGET
    switch_s: float = SWITCH_S
    check: bool = True
    record: bool = False
    horizon_rounds: int | None = None
    release_s: float = 0.0

    def __post_init__(self) -> None:
        if self.budget < 1 or self.switch_s < 0 or self.release_s < 0:
            raise ValueError("need budget >= 1, switch_s >= 0 and release_s >= 0")
        if self.horizon_rounds is not None and self.horizon_rounds < 1:
            raise ValueError(f"horizon_rounds must be >= 1, got {self.horizon_rounds}")

    @classmethod
    def of_leader(cls, live: LiveTaskSettings, record: bool = False,
                  release_s: float = 0.0) -> TaskSimSettings:
        """The live leader's way (module docstring, "Horizon"): the horizon
        and check of ``live``, the settings object the leader replans with
        (``SchedulerSettings.live_tasks``)."""
        return cls(horizon_rounds=live.horizon_rounds, check=live.check, record=record,
                   release_s=release_s)


@dataclass
class _Unit:
    """A macro-round under execution: real rounds [lo, hi) of ``job``."""

    job: TaskJob
    lo: int
    hi: int
    unstarted: int
    done_s: float = -math.inf


@dataclass
class _Queued:
    unit: _Unit
    entry: Entry
    not_before: float


@dataclass
class _GpuState:
    gpu: Gpu
    order: int
    free_s: float = 0.0
    last_job: JobId | None = None
    queue: list[_Queued] = field(default_factory=list)
    head: int = 0  # queue[head:] waits
    version: int = 0


class TaskSimulation:
    """One run of ``jobs`` on ``gpus`` under ``policy`` (module docstring)."""

    def __init__(self, jobs: Sequence[TaskJob], gpus: Sequence[Gpu], policy: TaskPolicy,
                 settings: TaskSimSettings | None = None, timer: Timer | None = None) -> None:
        if len({j.id for j in jobs}) != len(jobs) or len({g.id for g in gpus}) != len(gpus):
            raise ValueError("job and GPU ids must be unique")
        if any(j.done_rounds for j in jobs):
            raise ValueError("a workload's jobs start with no round done")
        self.jobs = {j.id: j for j in jobs}
        self.policy = policy
        self.settings = settings or TaskSimSettings()
        self.timer = timer
        self.gpus = {g.id: _GpuState(g, i, g.free_s) for i, g in enumerate(gpus)}
        self.seqs: Sequences = empty(self.gpus, policy=policy.name)
        self.started: set[EntryKey] = set()
        self.done_at: dict[EntryKey, float] = {}  # each started entry's synchronisation
        self.front: dict[JobId, int] = dict.fromkeys(self.jobs, 0)  # first round not done
        self.barrier: dict[tuple[JobId, int], float] = {}  # (job, hi) -> done
        self.waiting: dict[tuple[JobId, int], list[GpuId]] = {}
        self.heap: list[tuple[float, int, int]] = []  # (start, GPU order, version)
        self.order = [g.id for g in gpus]
        self.tasks_run: dict[JobId, int] = dict.fromkeys(self.jobs, 0)
        self.record: list[RunTask] = []
        self.plan_s: list[float] = []
        self.due: list[float] = []  # barriers to replan at (a heap; with a horizon only)

    # --- the online loop ---------------------------------------------------------

    def run(self) -> TaskSimResult:
        arrivals = sorted({j.arrival_s for j in self.jobs.values()})
        if self.settings.horizon_rounds is None:
            for t in arrivals:
                self._revise(t)
        else:
            self._run_to_barriers(arrivals)
        self._advance(math.inf)
        outcomes = tuple(self._outcome(j) for j in self.jobs.values())
        return summarise(self.policy.name, outcomes, tuple(self.plan_s), tuple(self.record))

    def _revise(self, t: float) -> None:
        """Replan at ``t``: keep what is under way, plan the rest anew."""
        self._advance(t)
        self._drop_unstarted(t)
        self._advance(math.inf)  # what is kept is settled: nothing can move it
        self._settle()
        self._replan(t)

    def _run_to_barriers(self, arrivals: Sequence[float]) -> None:
        """With a horizon: replan at every arrival and every barrier, in time order."""
        later = iter(arrivals)
        t: float | None = next(later, None)
        upcoming = next(later, math.inf)
        while t is not None and t < math.inf:
            self._revise(t)
            while upcoming <= t:
                upcoming = next(later, math.inf)
            t = self._next_barrier(t, upcoming)

    def _next_barrier(self, now: float, limit: float) -> float:
        """Start, in time order, the queued tasks before the first barrier
        after ``now`` or ``limit``, whichever is first; that time."""
        while True:
            while self.due and self.due[0] <= now:
                heapq.heappop(self.due)
            until = min(limit, self.due[0]) if self.due else limit
            start = self._first_start()
            if start >= until:
                return until
            _, order, _ = heapq.heappop(self.heap)
            self._start(self.gpus[self.order[order]], start)

    def _first_start(self) -> float:
        """The start of the first live task on the heap (stale ones dropped)."""
        while self.heap:
            start, order, version = self.heap[0]
            if version == self.gpus[self.order[order]].version:
                return start
            heapq.heappop(self.heap)
        return math.inf

    def _outcome(self, job: TaskJob) -> JobOutcome:
        finish = self.barrier.get((job.id, job.rounds))
        if finish is None or self.tasks_run[job.id] != job.rounds * job.tasks_per_round:
            raise RuntimeError(f"job {job.id} did not run all its tasks exactly once")
        return JobOutcome(job.id, job.arrival_s, finish, job.weight, self.tasks_run[job.id])

    def _drop_unstarted(self, now: float) -> None:
        """Forget the planned macro-rounds with no task started: the core's
        :func:`~scheduling.policies.hare.sequences.keep`; with a horizon,
        also those the live leader counts as started at ``now`` (the same
        rule, :func:`scheduling.live.tasks.assumed_started`: each GPU's next
        task of an open round, which the leader cannot tell from a running
        one, and the tasks after it planned to start by ``now``)."""
        started = self.started
        if self.settings.horizon_rounds is not None:
            done = {k for k in started if self.done_at[k] <= now}
            started = started | assumed_started(self.seqs, done, now)
        self.seqs = keep(self.seqs, started)
        kept = {(e.job, e.round) for _, e in self.seqs.entries()}
        for gs in self.gpus.values():
            gs.queue = [q for q in gs.queue[gs.head:] if (q.entry.job, q.entry.round) in kept]
            gs.head = 0
            gs.version += 1
        self.waiting.clear()
        self.heap.clear()
        for gs in self.gpus.values():
            self._refresh(gs)

    def _settle(self) -> None:
        """Every kept entry has run: its rounds are done for the planner
        (the core's ``fronts``, then ``forget``), so the sequences and the
        started set stay the size of one plan."""
        at = [msgspec.structs.replace(j, done_rounds=self.front[j.id])
              for j in self.jobs.values()]
        self.front = fronts(self.seqs, at)
        self.seqs = forget(self.seqs, self.front)
        self.started.clear()
        self.done_at.clear()

    def problem(self, now: float) -> TaskProblem:
        """The arrived jobs' rounds not under way, as a (real-round) problem."""
        jobs: list[TaskJob] = []
        ready: dict[JobId, float] = {}
        for job in self.jobs.values():
            front = self.front[job.id]
            if job.arrival_s > now or front == job.rounds:
                continue
            h = self.settings.horizon_rounds
            jobs.append(msgspec.structs.replace(
                job, done_rounds=front, rounds=job.rounds if h is None else min(job.rounds,
                                                                                 front + h)))
            barrier = self.barrier.get((job.id, front), -math.inf)
            if front > 0 and barrier > now:
                ready[job.id] = barrier
        gpus = tuple(msgspec.structs.replace(gs.gpu, free_s=gs.free_s)
                     for gs in self.gpus.values())
        return TaskProblem(tuple(jobs), gpus, now, ready)

    def _replan(self, now: float) -> None:
        real = self.problem(now)
        if not real.jobs:
            return
        kept = self.seqs
        self.seqs = plan(real, self.policy, kept, budget=self.settings.budget,
                         check=self.settings.check, timer=self.timer)
        self.plan_s.append(self.seqs.solve_s)
        units: dict[tuple[JobId, int], _Unit] = {}
        for gpu, entries in self.seqs.gpus.items():
            gs = self.gpus[gpu]
            for e in entries[len(kept.gpus[gpu]):]:
                unit = units.get((e.job, e.round))
                if unit is None:
                    job = self.jobs[e.job]
                    unit = units[(e.job, e.round)] = _Unit(job, e.round, e.round + e.rounds,
                                                           job.tasks_per_round)
                # Only a job's first round in a plan keeps its planned start
                # (``hold``): the policy's decision to start it (a FIFO's
                # head-of-line wait); later rounds follow their barriers,
                # which the truth may release earlier.
                gs.queue.append(_Queued(unit, e, e.start_s if e.hold else -math.inf))
        for gs in self.gpus.values():
            self._refresh(gs)

    # --- execution ---------------------------------------------------------------

    def _release(self, unit: _Unit) -> float | None:
        """When ``unit`` may start: its job's arrival, or the barrier of the
        macro-round before it once every task of that one has started."""
        if unit.lo == 0:
            return unit.job.arrival_s
        return self.barrier.get((unit.job.id, unit.lo))

    def _refresh(self, gs: _GpuState) -> None:
        """Put ``gs``'s next task on the heap, or wait for its barrier."""
        gs.version += 1
        if gs.head >= len(gs.queue):
            return
        q = gs.queue[gs.head]
        release = self._release(q.unit)
        if release is None:
            self.waiting.setdefault((q.unit.job.id, q.unit.lo), []).append(gs.gpu.id)
            return
        start = max(gs.free_s, release, q.not_before)
        heapq.heappush(self.heap, (start, gs.order, gs.version))

    def _advance(self, until: float) -> None:
        """Start, in time order, every queued task that starts before ``until``."""
        while self.heap:
            start, order, version = self.heap[0]
            gs = self.gpus[self.order[order]]
            if version != gs.version:
                heapq.heappop(self.heap)
                continue
            if start >= until:
                return
            heapq.heappop(self.heap)
            self._start(gs, start)

    def _start(self, gs: _GpuState, start: float) -> None:
        q = gs.queue[gs.head]
        gs.head += 1
        unit, job, gpu_type = q.unit, q.unit.job, gs.gpu.type
        n = unit.hi - unit.lo
        switch = self.settings.switch_s if gs.last_job not in (None, job.id) else 0.0
        end = start + switch + n * job.compute_s[gpu_type]
        done = end + n * job.sync(gpu_type)
        gs.free_s, gs.last_job = end, job.id
        unit.unstarted -= 1
        unit.done_s = max(unit.done_s, done)
        self.started.add(q.entry.key)
        self.done_at[q.entry.key] = done
        self.tasks_run[job.id] += n
        if self.settings.record:
            self.record.append(RunTask(job.id, unit.lo, n, q.entry.lo, gs.gpu.id, start, end,
                                       done, switch))
        if unit.unstarted == 0:
            passed = unit.done_s + self.settings.release_s
            self.barrier[(job.id, unit.hi)] = passed
            if self.settings.horizon_rounds is not None:
                heapq.heappush(self.due, passed)
            for gpu in self.waiting.pop((job.id, unit.hi), []):
                self._refresh(self.gpus[gpu])
        self._refresh(gs)


def simulate(jobs: Sequence[TaskJob], gpus: Sequence[Gpu], policy: TaskPolicy,
             settings: TaskSimSettings | None = None, timer: Timer | None = None
             ) -> TaskSimResult:
    """Run ``jobs`` on ``gpus`` under ``policy`` (module docstring)."""
    return TaskSimulation(jobs, gpus, policy, settings, timer).run()
