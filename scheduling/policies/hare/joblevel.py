"""The job-level planning that the baselines of hare.md §7.1 share.

Every baseline is *scale-fixed strict* (hare.md §2.2.3): a job of sync scale
S runs each round as S tasks side by side on S GPUs, and keeps the same S
GPUs for all its remaining rounds, back to back: round r+1 starts at round
r's barrier, so a round lasts ``L = max over its GPUs of T^c + T^s`` and the
job's tasks on a GPU are ``L`` apart (its GPUs idle while the round
synchronises; no other job's task fills that gap). A GPU is free again when
its last task of the job has computed (the model's ``end_s``: the final sync
overlaps whatever runs there next).

:class:`Planner` keeps each GPU's φ (when it is free) while a baseline
places jobs one after another; :meth:`Planner.earliest` is the rule "the job
starts at the earliest time at or after its release when S GPUs able to run
it are free at once".

A job already running when the problem is built (a replan; its next round
is due at ``ready_s``, or some rounds are done) is *started*. The
non-preemptive baselines place started jobs first, each as soon as S of its
GPUs are free from its release, so that a replan never holds a running job
back for a newcomer; the problem does not say which GPUs a job ran on, so it
gets S GPUs by the baseline's own rule, normally its own ones, which are the
first free at its release.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from scheduling.policies.hare.checks import release_s, validate_problem
from scheduling.policies.hare.model import Gpu, GpuId, Task, TaskJob, TaskProblem
from shared.ids import GpuType

# Picks S GPUs for a job from those free at its start (all able to run it).
Chooser = Callable[[TaskJob, list[Gpu], int], list[Gpu]]


def round_time(job: TaskJob, gpu_type: GpuType) -> float:
    """One round of ``job`` with every task on a GPU of ``gpu_type``: T^c + T^s."""
    return job.compute_s[gpu_type] + job.sync(gpu_type)


def fastest(job: TaskJob, free: list[Gpu], scale: int) -> list[Gpu]:
    """The ``scale`` GPUs of least round time for ``job``, ties by GPU order
    (Gavel's heterogeneity-aware choice, hare.md §7.1). ``free`` is in GPU
    order and the sort is stable."""
    return sorted(free, key=lambda g: round_time(job, g.type))[:scale]


def in_order(job: TaskJob, free: list[Gpu], scale: int) -> list[Gpu]:
    """The first ``scale`` GPUs in the cluster's order: a scheduler that
    sees every GPU as the same (``free`` is in GPU order)."""
    return free[:scale]


def started(problem: TaskProblem, job: TaskJob) -> bool:
    """Whether ``job`` ran before this problem's ``now`` (module docstring)."""
    return job.done_rounds > 0 or job.id in problem.ready_s


class Planner:
    """Job-by-job placement on the problem's GPUs (module docstring)."""

    def __init__(self, problem: TaskProblem) -> None:
        validate_problem(problem)
        self.problem = problem
        self.free: dict[GpuId, float] = {g.id: g.free_s for g in problem.gpus}
        self.tasks: list[Task] = []
        for job in self.jobs():
            if job.tasks_per_round > len(self.eligible(job)):
                raise ValueError(
                    f"job {job.id} needs {job.tasks_per_round} GPUs at once; the problem has "
                    f"{len(self.eligible(job))} that can run it"
                )

    def jobs(self) -> list[TaskJob]:
        """The jobs with a remaining round, in the problem's order."""
        return [j for j in self.problem.jobs if j.remaining_rounds > 0]

    def eligible(self, job: TaskJob, among: Sequence[Gpu] | None = None) -> list[Gpu]:
        """The GPUs (of ``among``, default all) able to run ``job``, in order."""
        pool = self.problem.gpus if among is None else among
        return [g for g in pool if g.type in job.compute_s]

    def release(self, job: TaskJob) -> float:
        return release_s(self.problem, job)

    def earliest(self, job: TaskJob, base: float, gpus: Sequence[Gpu]) -> float:
        """The earliest time ``>= base`` when ``tasks_per_round`` of ``gpus``
        are free at once (``math.inf`` if there are too few)."""
        frees = sorted(self.free[g.id] for g in gpus)
        s = job.tasks_per_round
        return max(base, frees[s - 1]) if len(frees) >= s else math.inf

    def free_at(self, gpus: Sequence[Gpu], t: float) -> list[Gpu]:
        """Those of ``gpus`` free at ``t``, in order."""
        return [g for g in gpus if self.free[g.id] <= t]

    def place(self, job: TaskJob, chosen: Sequence[Gpu], start: float) -> None:
        """All remaining rounds of ``job`` on ``chosen`` from ``start``,
        back to back (module docstring)."""
        length = max(round_time(job, g.type) for g in chosen)
        first = job.done_rounds
        for r in range(first, job.rounds):
            at = start + (r - first) * length
            for i, g in enumerate(chosen):
                self.tasks.append(Task(job.id, r, i, g.id, at, job.compute_s[g.type],
                                       job.sync(g.type)))
        last = start + (job.rounds - 1 - first) * length
        for g in chosen:
            self.free[g.id] = last + job.compute_s[g.type]

    def place_now(self, job: TaskJob, base: float, choose: Chooser,
                  among: Sequence[Gpu] | None = None) -> float:
        """Place ``job`` at its earliest start ``>= base`` on the GPUs
        ``choose`` picks from those free then; return the start."""
        gpus = self.eligible(job, among)
        t = self.earliest(job, base, gpus)
        self.place(job, choose(job, self.free_at(gpus, t), job.tasks_per_round), t)
        return t

    def place_started(self, choose: Chooser) -> list[TaskJob]:
        """Place the started jobs first, by release then id; return the others."""
        first = sorted((j for j in self.jobs() if started(self.problem, j)),
                       key=lambda j: (self.release(j), j.id))
        for job in first:
            self.place_now(job, self.release(job), choose)
        return [j for j in self.jobs() if not started(self.problem, j)]

    def list_schedule(self, jobs: Sequence[TaskJob], key: Callable[[TaskJob], tuple[float, ...]],
                      choose: Chooser) -> None:
        """Work-conserving list scheduling: at each moment, of the jobs
        released that have S able GPUs free, start the least ``key``; a job
        that does not fit does not hold back the jobs after it."""
        pending = sorted(jobs, key=key)
        t = min((self.release(j) for j in pending), default=math.inf)
        while pending:
            counts = self._free_counts(t)
            fits = next((j for j in pending if self.release(j) <= t and sum(
                counts.get(ty, 0) for ty in j.compute_s) >= j.tasks_per_round), None)
            if fits is not None:
                gpus = self.free_at(self.eligible(fits), t)
                self.place(fits, choose(fits, gpus, fits.tasks_per_round), t)
                pending.remove(fits)
                continue
            later = [self.release(j) for j in pending] + list(self.free.values())
            t = min(x for x in later if x > t)

    def _free_counts(self, t: float) -> dict[GpuType, int]:
        """How many GPUs of each type are free at ``t``."""
        counts: dict[GpuType, int] = {}
        for g in self.problem.gpus:
            if self.free[g.id] <= t:
                counts[g.type] = counts.get(g.type, 0) + 1
        return counts
