"""The exact optimum of Hare_Sched (hare.md §5.1, Σ w_n C_n subject to
(4)-(8)) on tiny instances, by enumeration; for tests only.

Every feasible schedule assigns each task to one GPU (5) and, since a GPU's
tasks do not overlap (8), orders the tasks of each GPU by start. For a fixed
assignment and per-GPU order, the constraints are a precedence graph: a task
starts no earlier than its release (4) and its GPU's ``free_s``, than the end
of its predecessor on the GPU (8) and than the done time of every task of its
job's previous round (7). Its earliest start times, the longest paths of that
graph, are componentwise no later than those of any feasible schedule with
the same assignment and orders, and Σ w_n C_n does not decrease when a start
moves later; so the least objective over all assignments and per-GPU orders,
each scheduled as early as possible, is the optimum. Orders whose graph has a
cycle (a task queued on a GPU behind one that waits for it) are infeasible
and skipped.

Two tasks of the same job and round are interchangeable, so of the orders
that only swap them on one GPU one is enough (indices ascending).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from scheduling.policies.hare.checks import (
    TaskKey,
    release_s,
    task_keys,
    validate_problem,
    weighted_completion,
)
from scheduling.policies.hare.model import Gpu, Task, TaskJob, TaskProblem, TaskSchedule
from shared.ids import JobId

MAX_TASKS = 6
MAX_GPUS = 3


def _start_times(
    keys: list[TaskKey], jobs: dict[JobId, TaskJob], gpus: Sequence[Gpu],
    assign: Sequence[int], seqs: Sequence[Sequence[int]], release: list[float],
) -> list[float] | None:
    """Earliest starts for the assignment and per-GPU orders (longest paths
    by Kahn's algorithm), or None when the orders contradict the barriers."""
    n = len(keys)
    edges: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    indegree = [0] * n
    length = [jobs[k[0]].compute_s[gpus[assign[i]].type] for i, k in enumerate(keys)]
    done = [length[i] + jobs[k[0]].sync(gpus[assign[i]].type) for i, k in enumerate(keys)]
    for seq in seqs:
        for a, b in itertools.pairwise(seq):
            edges[a].append((b, length[a]))
            indegree[b] += 1
    for a, b in itertools.product(range(n), repeat=2):
        if keys[a][0] == keys[b][0] and keys[b][1] == keys[a][1] + 1:
            edges[a].append((b, done[a]))
            indegree[b] += 1
    start = list(release)
    ready = [i for i in range(n) if indegree[i] == 0]
    seen = 0
    while ready:
        a = ready.pop()
        seen += 1
        for b, gap in edges[a]:
            start[b] = max(start[b], start[a] + gap)
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    return start if seen == n else None


def _orders(members: list[int], keys: list[TaskKey]) -> list[tuple[int, ...]]:
    """The orders of one GPU's tasks worth trying: rounds of a job ascending
    (else a cycle), indices of one round ascending (the rest are the same)."""
    out = []
    for perm in itertools.permutations(members):
        pos = {i: p for p, i in enumerate(perm)}
        if all(pos[a] < pos[b] for a in members for b in members
               if keys[a][0] == keys[b][0] and keys[a][1:] < keys[b][1:]):
            out.append(perm)
    return out


def optimum(problem: TaskProblem) -> tuple[float, TaskSchedule]:
    """The least Σ w_n C_n of any feasible schedule of ``problem`` and one
    schedule reaching it (at most 6 tasks and 3 GPUs)."""
    validate_problem(problem)
    jobs = {j.id: j for j in problem.jobs}
    keys = [key for job in problem.jobs for key in task_keys(job)]
    gpus = problem.gpus
    if len(keys) > MAX_TASKS or len(gpus) > MAX_GPUS:
        raise ValueError(f"brute force takes at most {MAX_TASKS} tasks and {MAX_GPUS} GPUs")
    able = [[m for m, g in enumerate(gpus) if g.type in jobs[k[0]].compute_s] for k in keys]
    best: tuple[float, TaskSchedule] = (math.inf, TaskSchedule(()))
    for assign in itertools.product(*able):
        members = [[i for i in range(len(keys)) if assign[i] == m] for m in range(len(gpus))]
        release = [max(release_s(problem, jobs[k[0]]), gpus[assign[i]].free_s)
                   for i, k in enumerate(keys)]
        for seqs in itertools.product(*(_orders(ms, keys) for ms in members)):
            start = _start_times(keys, jobs, gpus, assign, seqs, release)
            if start is None:
                continue
            tasks = tuple(
                Task(k[0], k[1], k[2], gpus[assign[i]].id, start[i],
                     jobs[k[0]].compute_s[gpus[assign[i]].type],
                     jobs[k[0]].sync(gpus[assign[i]].type))
                for i, k in enumerate(keys)
            )
            value = weighted_completion(problem, TaskSchedule(tasks))
            if value < best[0]:
                best = (value, TaskSchedule(tasks))
    return best

