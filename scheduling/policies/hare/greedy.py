"""Steps 2 and 3 of Hare's Algorithm 1 (hare.md §5.2, lines 4-17): order the
tasks by the relaxation's middle completion times and place them one by one.

``H_{i,m} = x̂_i + ½ T^c_{i,m}`` and ``H_i = max_m H_{i,m}`` over the GPUs
able to run task i (line 4; only their types matter). Tasks go in
non-descending ``H_i``, ties by (job id, round, index). A task's available
time ``t_i`` is its job's release (4) in its first remaining round (line 8),
else when the last task of its previous round is done (line 10, the barrier
(7)); it starts at ``x̃_i = max(t_i, φ_m)`` on the GPU chosen (line 13) and
keeps it until ``φ_m = x̃_i + T^c`` (line 16: its sync overlaps the next
task there).

Line 10 needs the previous round placed. The LP's barrier (7) puts a round's
x̂ after the previous round's, but ``H`` adds half a compute time that
differs by GPU type, and the LP may tie, so the order is made robust: the
tasks of a round are released only once every task of the previous round is
placed, and the next task is always the released one of least ``H``. When
H respects the rounds this is exactly the sorted sequence π.

Two placements:

* ``earliest-free`` (Algorithm 1, line 12): ``m* = argmin φ_m`` over the GPUs
  able to run the job. The paper does not say how ties break; they are the
  rule, not the exception, online: every idle GPU has φ = now. ``ties =
  "fastest"`` (the default) takes the tied GPU with the least T^c for the
  task, then GPU order; ``ties = "order"`` GPU order alone, which picks a type
  by where its GPUs happen to be numbered (docs/hare.md measures both);
* ``earliest-finish``: the GPU minimising ``max(t_i, φ_m) + T^c_{i,m}``, ties
  by the earliest start, then GPU order. With one fast and one slow GPU,
  line 12 sends a round's second task to the idle slow GPU even when
  queueing on the fast one finishes earlier; this variant does not.

Each GPU type keeps its GPUs' φ in a min-tree, so a placement costs
O(types · log |M|): 10^4 tasks on 160 GPUs take well under a second.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from scheduling.policies.hare.checks import TaskKey, release_s, usable_types, validate_problem
from scheduling.policies.hare.model import Gpu, Task, TaskJob, TaskProblem
from shared.ids import GpuType, JobId

Placement = Literal["earliest-free", "earliest-finish"]
PLACEMENTS: tuple[Placement, ...] = ("earliest-free", "earliest-finish")
Ties = Literal["fastest", "order"]
TIES: tuple[Ties, ...] = ("fastest", "order")


class MinTree:
    """Values of one GPU type's GPUs (their φ) in a segment tree: the leftmost
    least value, and the leftmost value at or below a bound, in O(log n)."""

    def __init__(self, values: list[float]) -> None:
        self._size = 1 << max(0, len(values) - 1).bit_length()
        self._tree = [math.inf] * (2 * self._size)
        self._tree[self._size:self._size + len(values)] = values
        for i in range(self._size - 1, 0, -1):
            self._tree[i] = min(self._tree[2 * i], self._tree[2 * i + 1])

    def set(self, index: int, value: float) -> None:
        i = index + self._size
        self._tree[i] = value
        while i > 1:
            i //= 2
            self._tree[i] = min(self._tree[2 * i], self._tree[2 * i + 1])

    def get(self, index: int) -> float:
        return self._tree[index + self._size]

    def leftmost_at_most(self, bound: float) -> int | None:
        """The first index whose value is ``<= bound``, or None."""
        if self._tree[1] > bound:
            return None
        i = 1
        while i < self._size:
            i = 2 * i if self._tree[2 * i] <= bound else 2 * i + 1
        return i - self._size

    def leftmost_min(self) -> tuple[float, int]:
        """The least value and the first index holding it."""
        least = self._tree[1]
        index = self.leftmost_at_most(least)
        assert index is not None  # the least value is at most itself
        return least, index


@dataclass
class _Type:
    """The GPUs of one type, in problem order, and their φ."""

    gpus: list[tuple[int, Gpu]]  # (problem order, GPU)
    phi: MinTree


@dataclass
class _Progress:
    """Where a job stands: the round being placed, how many of its tasks are
    placed, when it may start (t_i) and when its placed tasks are done."""

    types: tuple[GpuType, ...]  # the usable ones, in problem order
    round: int
    available: float
    placed: int = 0
    done: float = -math.inf


def _gpu_types(problem: TaskProblem) -> dict[GpuType, _Type]:
    by_type: dict[GpuType, list[tuple[int, Gpu]]] = {}
    for order, gpu in enumerate(problem.gpus):
        by_type.setdefault(gpu.type, []).append((order, gpu))
    # φ_m starts when the GPU is free, but no task starts before ``now``, so
    # GPUs free earlier are all free at ``now`` and tie, broken by GPU order.
    return {
        t: _Type(gpus, MinTree([max(g.free_s, problem.now) for _, g in gpus]))
        for t, gpus in by_type.items()
    }


def _choose(
    types: dict[GpuType, _Type], job: TaskJob, usable: tuple[GpuType, ...], t_i: float,
    placement: Placement, ties: Ties = "fastest",
) -> tuple[GpuType, int, float]:
    """The GPU for a task of ``job`` available at ``t_i``: its type, its index
    within the type, and the task's start x̃_i (lines 12-13)."""
    best: tuple[tuple[float, ...], GpuType, int, float] | None = None
    for t in usable:
        kind = types[t]
        at = kind.phi.leftmost_at_most(t_i) if placement == "earliest-finish" else None
        if at is None:
            phi, at = kind.phi.leftmost_min()
            start = max(t_i, phi)
        else:
            phi, start = kind.phi.get(at), t_i
        order = float(kind.gpus[at][0])
        speed = job.compute_s[t] if ties == "fastest" else 0.0
        key = (phi, speed, order) if placement == "earliest-free" else (
            start + job.compute_s[t], start, order)
        if best is None or key < best[0]:
            best = (key, t, at, start)
    assert best is not None  # validate_problem: every job has a usable type
    return best[1], best[2], best[3]


def _release(
    heap: list[tuple[float, JobId, int, int]], starts: Mapping[TaskKey, float],
    job: TaskJob, round_: int, half: float,
) -> None:
    """Queue round ``round_`` of ``job`` by H_i = x̂_i + ½ max T^c (line 4)."""
    for k in range(job.tasks_per_round):
        heapq.heappush(heap, (starts[(job.id, round_, k)] + half, job.id, round_, k))


def greedy(
    problem: TaskProblem, starts: Mapping[TaskKey, float], placement: Placement = "earliest-free",
    ties: Ties = "fastest",
) -> tuple[Task, ...]:
    """Place every remaining task of ``problem`` in H order given the
    relaxation's starts x̂ (Algorithm 1, lines 4-17); tasks come back in the
    order they were placed."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, not {placement!r}")
    if ties not in TIES:
        raise ValueError(f"ties must be one of {TIES}, not {ties!r}")
    validate_problem(problem)
    types = _gpu_types(problem)
    jobs = {j.id: j for j in problem.jobs}
    progress: dict[JobId, _Progress] = {}
    half: dict[JobId, float] = {}
    heap: list[tuple[float, JobId, int, int]] = []
    for job in problem.jobs:
        if job.remaining_rounds == 0:
            continue
        usable = usable_types(problem, job)
        progress[job.id] = _Progress(usable, job.done_rounds, release_s(problem, job))
        half[job.id] = 0.5 * max(job.compute_s[t] for t in usable)
        _release(heap, starts, job, job.done_rounds, half[job.id])
    placed: list[Task] = []
    while heap:
        _, jid, round_, index = heapq.heappop(heap)
        job, state = jobs[jid], progress[jid]
        t, at, start = _choose(types, job, state.types, state.available, placement, ties)
        kind = types[t]
        task = Task(jid, round_, index, kind.gpus[at][1].id, start, job.compute_s[t], job.sync(t))
        kind.phi.set(at, task.end_s)  # line 16
        placed.append(task)
        state.placed += 1
        state.done = max(state.done, task.done_s)
        if state.placed == job.tasks_per_round and round_ + 1 < job.rounds:
            # The round is placed: the next one may start when it is done (line 10).
            state.round, state.available, state.placed = round_ + 1, state.done, 0
            state.done = -math.inf
            _release(heap, starts, job, round_ + 1, half[jid])
    return tuple(placed)
