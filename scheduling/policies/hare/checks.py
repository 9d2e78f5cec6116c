"""Feasibility and objective of a task schedule (hare.md §5.1, Hare_Sched).

:func:`check_schedule` tests a :class:`~.model.TaskSchedule` against the
constraints of Hare_Sched as this model states them:

* every remaining round ``done_rounds .. rounds - 1`` of every job has
  exactly ``tasks_per_round`` tasks, indices ``0 .. S-1``, and no other
  task is placed;
* (4) a task starts no earlier than its job's release: arrival, the
  problem's ``now`` and the job's ``ready_s``;
* (5) a task runs on one GPU, of a type that can run its job, and carries
  the job's compute and sync times on that type;
* (7) round ``r + 1`` starts only after every task of round ``r`` is done
  (computed and synchronised);
* (8) the tasks of one GPU do not overlap in ``[start_s, end_s)`` and none
  starts before the GPU's ``free_s``.

(6), ``C_n >= x_i + T^c + T^s``, defines the completion time; it is what
:func:`completion_times` computes. The objective of the paper is
Σ w_n C_n (:func:`weighted_completion`); :func:`weighted_jct` is the
weighted job completion time measured from arrival, Σ w_n (C_n - a_n).
Jobs without a remaining round have no task and no C_n; both sums leave
them out.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from scheduling.policies.hare.model import Gpu, GpuId, Task, TaskJob, TaskProblem, TaskSchedule
from shared.ids import GpuType, JobId

# Times in a schedule are sums of the problem's floats, and a schedule built
# elsewhere (a simulator, a test) may add them in another order; a tolerance
# this small tells rounding apart from a real violation.
REL_TOL = 1e-9
ABS_TOL = 1e-9

TaskKey = tuple[JobId, int, int]  # (job, round, index)


def _before(a: float, b: float) -> bool:
    """``a < b`` by more than rounding."""
    return a < b - max(ABS_TOL, REL_TOL * abs(b))


def release_s(problem: TaskProblem, job: TaskJob) -> float:
    """The earliest start of any task of ``job`` (4): its arrival, the
    problem's ``now`` and, on a replan, when its next round may start."""
    return max(job.arrival_s, problem.now, problem.ready_s.get(job.id, -math.inf))


def usable_types(problem: TaskProblem, job: TaskJob) -> tuple[GpuType, ...]:
    """The GPU types of the problem that can run ``job``, in the order the
    problem's GPUs first show them."""
    seen = dict.fromkeys(g.type for g in problem.gpus)
    return tuple(t for t in seen if t in job.compute_s)


def validate_problem(problem: TaskProblem) -> None:
    """Ids unique, and every job with a remaining round runnable on some GPU."""
    if len({j.id for j in problem.jobs}) != len(problem.jobs):
        raise ValueError("problem: duplicate job ids")
    if len({g.id for g in problem.gpus}) != len(problem.gpus):
        raise ValueError("problem: duplicate GPU ids")
    for job in problem.jobs:
        if job.remaining_rounds and not usable_types(problem, job):
            raise ValueError(f"problem: no GPU of the problem can run job {job.id}")


def task_keys(job: TaskJob) -> list[TaskKey]:
    """The remaining tasks of ``job``, round by round."""
    return [
        (job.id, r, k)
        for r in range(job.done_rounds, job.rounds)
        for k in range(job.tasks_per_round)
    ]


def _check_complete(problem: TaskProblem, schedule: TaskSchedule) -> dict[TaskKey, Task]:
    jobs = {j.id: j for j in problem.jobs}
    placed: dict[TaskKey, Task] = {}
    for task in schedule.tasks:
        key = (task.job, task.round, task.index)
        job = jobs.get(task.job)
        if job is None:
            raise ValueError(f"tasks: task {key} belongs to no job of the problem")
        in_round = job.done_rounds <= task.round < job.rounds
        if not (in_round and 0 <= task.index < job.tasks_per_round):
            raise ValueError(
                f"tasks: task {key} is outside job {job.id}'s remaining rounds "
                f"{job.done_rounds}..{job.rounds - 1} or indices 0..{job.tasks_per_round - 1}"
            )
        if key in placed:
            raise ValueError(f"tasks: task {key} is placed twice")
        placed[key] = task
    for job in problem.jobs:
        for key in task_keys(job):
            if key not in placed:
                raise ValueError(f"tasks: task {key} of job {job.id} is missing")
    return placed


def _check_task(problem: TaskProblem, job: TaskJob, task: Task, gpu: Gpu | None) -> None:
    key = (task.job, task.round, task.index)
    if gpu is None:
        raise ValueError(f"(5): task {key} is on GPU {task.gpu}, which the problem does not have")
    if gpu.type not in job.compute_s:
        raise ValueError(
            f"(5): task {key} is on GPU {gpu.id} of type {gpu.type}, which cannot run it"
        )
    want = (job.compute_s[gpu.type], job.sync(gpu.type))
    if not all(
        math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
        for a, b in zip((task.compute_s, task.sync_s), want, strict=True)
    ):
        raise ValueError(
            f"(5): task {key} has compute/sync {task.compute_s}/{task.sync_s} s, but job "
            f"{job.id} takes {want[0]}/{want[1]} s on type {gpu.type}"
        )
    release = release_s(problem, job)
    if _before(task.start_s, release):
        raise ValueError(f"(4): task {key} starts at {task.start_s}, before its release {release}")
    if _before(task.start_s, gpu.free_s):
        raise ValueError(
            f"(8): task {key} starts at {task.start_s}, before GPU {gpu.id} is free at {gpu.free_s}"
        )


def _check_barriers(problem: TaskProblem, placed: dict[TaskKey, Task]) -> None:
    for job in problem.jobs:
        for r in range(job.done_rounds + 1, job.rounds):
            prev = [placed[(job.id, r - 1, k)] for k in range(job.tasks_per_round)]
            done = max(prev, key=lambda t: t.done_s)
            for k in range(job.tasks_per_round):
                task = placed[(job.id, r, k)]
                if _before(task.start_s, done.done_s):
                    raise ValueError(
                        f"(7): task {(job.id, r, k)} starts at {task.start_s}, before task "
                        f"{(job.id, r - 1, done.index)} of the previous round is done at "
                        f"{done.done_s}"
                    )


def _check_overlaps(placed: dict[TaskKey, Task]) -> None:
    by_gpu: defaultdict[GpuId, list[Task]] = defaultdict(list)
    for task in placed.values():
        by_gpu[task.gpu].append(task)
    for gpu, tasks in by_gpu.items():
        tasks.sort(key=lambda t: (t.start_s, t.end_s))
        for a, b in itertools.pairwise(tasks):
            if _before(b.start_s, a.end_s):
                raise ValueError(
                    f"(8): tasks {(a.job, a.round, a.index)} [{a.start_s}, {a.end_s}) and "
                    f"{(b.job, b.round, b.index)} [{b.start_s}, {b.end_s}) overlap on GPU {gpu}"
                )


def check_schedule(problem: TaskProblem, schedule: TaskSchedule) -> None:
    """Raise ValueError naming the first violated constraint (see the module
    docstring); return None when ``schedule`` is feasible for ``problem``."""
    validate_problem(problem)
    placed = _check_complete(problem, schedule)
    jobs = {j.id: j for j in problem.jobs}
    gpus = {g.id: g for g in problem.gpus}
    for task in placed.values():
        _check_task(problem, jobs[task.job], task, gpus.get(task.gpu))
    _check_barriers(problem, placed)
    _check_overlaps(placed)


def completion_times(problem: TaskProblem, schedule: TaskSchedule) -> dict[JobId, float]:
    """C_n (6): when the last task of job n is done, for every job with a
    task in ``schedule``."""
    done: dict[JobId, float] = {}
    for task in schedule.tasks:
        done[task.job] = max(done.get(task.job, -math.inf), task.done_s)
    return {j.id: done[j.id] for j in problem.jobs if j.id in done}


def weighted_completion(problem: TaskProblem, schedule: TaskSchedule) -> float:
    """Hare_Sched's objective Σ w_n C_n."""
    done = completion_times(problem, schedule)
    return sum(j.weight * done[j.id] for j in problem.jobs if j.id in done)


def weighted_jct(problem: TaskProblem, schedule: TaskSchedule) -> float:
    """Σ w_n (C_n - a_n): Σ w_n C_n less a constant of the problem, so both
    have the same minimisers."""
    done = completion_times(problem, schedule)
    return sum(j.weight * (done[j.id] - j.arrival_s) for j in problem.jobs if j.id in done)
