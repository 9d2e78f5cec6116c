"""The task-level model of Hare (hare.md §5.1, Table 1).

A relaxed-synchronisation job has ``rounds`` training rounds of
``tasks_per_round`` tasks each (its sync scale, |D_r|). A task is one batch
(or, after grouping, one macro-task of K batches) on one GPU. The tasks of a
round may run on any GPUs, one after another or side by side; the next round
starts only when every task of this one has computed and synchronised
(constraint (7)). A GPU runs one task at a time, never preempted (8).

Times are seconds. ``compute_s[t]`` is T^c of one task on a GPU of type ``t``
and ``sync_s[t]`` its T^s; a type missing from ``compute_s`` cannot run the
job. A GPU is free again ``compute_s`` after a task starts: its sync overlaps
the next task there (Algorithm 1, line 16), but the round's barrier waits for
it.
"""

from __future__ import annotations

from typing import NewType, Protocol

import msgspec

from shared.ids import GpuType, JobId

GpuId = NewType("GpuId", str)


class TaskJob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One relaxed-sync job as the task scheduler sees it (a_n, w_n, R_n, D_r)."""

    id: JobId
    arrival_s: float
    rounds: int
    tasks_per_round: int
    compute_s: dict[GpuType, float]
    sync_s: dict[GpuType, float] = {}
    weight: float = 1.0
    model: str = ""
    # Rounds already completed before this problem's ``now`` (a replan); the
    # problem's rounds are rounds ``done_rounds .. rounds - 1``.
    done_rounds: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.tasks_per_round < 1:
            raise ValueError(f"task job {self.id}: rounds and tasks_per_round must be >= 1")
        if not 0 <= self.done_rounds <= self.rounds:
            raise ValueError(f"task job {self.id}: done_rounds outside 0..rounds")
        if not self.compute_s:
            raise ValueError(f"task job {self.id}: no GPU type can run it")
        if any(t <= 0 for t in self.compute_s.values()):
            raise ValueError(f"task job {self.id}: compute times must be > 0")
        if any(t < 0 for t in self.sync_s.values()):
            raise ValueError(f"task job {self.id}: sync times must be >= 0")
        if self.weight <= 0:
            raise ValueError(f"task job {self.id}: weight must be > 0")

    def sync(self, gpu_type: GpuType) -> float:
        return self.sync_s.get(gpu_type, 0.0)

    @property
    def remaining_rounds(self) -> int:
        return self.rounds - self.done_rounds


class Gpu(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One GPU (m ∈ M); ``free_s`` is when it can take its next task (φ_m)."""

    id: GpuId
    type: GpuType
    free_s: float = 0.0


class TaskProblem(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Input of one task-scheduling call. Jobs are those arrived by ``now``
    (an online replan) or all of them (the paper's offline setting)."""

    jobs: tuple[TaskJob, ...]
    gpus: tuple[Gpu, ...]
    now: float = 0.0
    # Earliest start of each job's next round, where a replan finds a round
    # boundary later than ``now`` (its last round's sync still running).
    ready_s: dict[JobId, float] = {}


class Task(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One placed task: task ``index`` of round ``round`` of ``job`` on ``gpu``
    from ``start_s`` (x̃_i, ỹ_{i,m})."""

    job: JobId
    round: int
    index: int
    gpu: GpuId
    start_s: float
    compute_s: float
    sync_s: float = 0.0

    @property
    def end_s(self) -> float:
        """When the GPU is free again."""
        return self.start_s + self.compute_s

    @property
    def done_s(self) -> float:
        """When this task has also synchronised (its part of the barrier)."""
        return self.start_s + self.compute_s + self.sync_s


class TaskSchedule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a task policy decides: every remaining task of every job, placed.

    ``lower_bound`` is the objective of a relaxation when the policy solved
    one (Σ w_n C_n that no feasible schedule beats), else None.
    """

    tasks: tuple[Task, ...]
    lower_bound: float | None = None


class TaskPolicy(Protocol):
    name: str

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        """Place every remaining task of ``problem``."""
        ...
