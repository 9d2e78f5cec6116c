"""What running one entry of a task sequence does on this executor's
backend (docs/hare.md §7, step 4b). :mod:`executor.taskrun` is one shell
for both backends: it follows the revisions and keeps each GPU's order
and waits (the rules of :mod:`executor.tasks`); a :class:`TaskWork` does
an entry's work and sends its result.

* :class:`EmulatedWork`: the world model's switch and compute times, the
  gradients "sent" ``T^s`` after the compute (step 2b).
* :class:`RealWork` (:mod:`executor.realwork`): the round's parameters
  from the job's aggregator, the task on the GPU's resident trainers, the
  gradients to the aggregator (step 4b); the GPU's next entry staged on
  its trainers while one computes.

An entry's work ends in one of three ways: :class:`Computed` (its
``task_done`` goes out once :meth:`TaskWork.deliver` returned), None
(a revision abandoned it: nothing is reported) or :class:`TaskFailed`
(raised: the job's script failed, or its parameters never came; the GPU
goes on with its next entry and nothing is reported). A failure that
``fails_job`` (the job's own script raised) ends the job: the shell reports
its ``job_failed`` and has the work :meth:`TaskWork.drop` the job.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from executor.tasks import Refused, TaskTimes, entry_run, sequence_times
from shared.errors import CodedError
from shared.ids import GpuType, JobId
from shared.job import JobSpec
from shared.sequence import TaskEntry, TaskKey
from world.hare import SWITCH_S
from world.truth import GroundTruth

if TYPE_CHECKING:  # the emulated executor runs without torch
    import torch

Clock = Callable[[], float]
Running = Callable[[], bool]  # whether the GPU still runs the entry (not abandoned)
NO_PARAMS = "no_params"  # the job's aggregator gave no parameters of the round in time


class TaskFailed(CodedError):
    """An entry that cannot be run: ``code`` (``task_failed``, ...) and
    ``words``; ``fails_job``: the job cannot run anywhere (its script
    raised), so it fails, as :class:`executor.backend.Refusal`'s ``fail_job``."""

    def __init__(self, code: str, words: str, fails_job: bool = False) -> None:
        super().__init__(code, words)
        self.fails_job = fails_job


@dataclass(frozen=True)
class Computed:
    """An entry computed on GPU ``gpu`` over ``[started, ended)`` (wall
    clock); ``synced``: when its gradients are sent, when the work knows it
    in advance (emulated), else None (set once :meth:`TaskWork.deliver`
    returns); ``gradients``: one dict per micro-batch (real work);
    ``staged``: it was sent to its trainer while the entry before it computed."""

    gpu: int
    started: float
    ended: float
    synced: float | None = None
    gradients: tuple[dict[str, torch.Tensor], ...] = field(default=(), repr=False)
    staged: bool = False


class TaskWork(Protocol):
    """One backend's work of an entry (module doc)."""

    def take(self, specs: tuple[JobSpec, ...]) -> Refused | None:
        """Whether a revision naming ``specs`` can run here (None: yes); the
        work keeps what it needs of them."""

    async def compute(self, gpu: int, entry: TaskEntry, held: tuple[int, int],
                      last_job: JobId | None, upcoming: tuple[JobId, ...],
                      running: Running, ahead: TaskEntry | None = None) -> Computed | None:
        """Run ``entry`` on GPU ``gpu`` (after ``last_job``'s entry; its
        later entries' jobs ``upcoming``), under revision ``held``;
        ``ahead``: the GPU's next entry when it may start as soon as this
        one's compute ends (its barrier met), which the work may stage."""

    def staged(self, gpu: int) -> TaskKey | None:
        """The entry GPU ``gpu`` has staged ahead (it computes without waiting
        for its planned start), or None."""

    async def deliver(self, entry: TaskEntry, held: tuple[int, int],
                      done: Computed) -> None:
        """Send ``done``'s gradients (the ``task_done`` follows)."""

    def drop(self, job: JobId) -> None:
        """``job`` failed: keep nothing of it (its models go at :meth:`tidy`)."""

    async def tidy(self, gpu: int) -> tuple[JobId, ...]:
        """Free on GPU ``gpu`` what the jobs dropped held; called by the GPU's
        own runner between its entries, never while one runs; the jobs freed."""


class EmulatedWork:
    """The emulated backend's work: the world model's times (T^c, T^s and
    the switch) over the executor's time scale (:mod:`executor.tasks`)."""

    def __init__(self, truth: GroundTruth, gpu_type: GpuType, time_scale: float,
                 clock: Clock, switch_s: float = SWITCH_S) -> None:
        self.truth, self.gpu_type, self.time_scale = truth, gpu_type, time_scale
        self.clock = clock
        self.switch_s = switch_s / time_scale
        self.times: dict[JobId, TaskTimes] = {}
        self.wake: dict[int, asyncio.Event] = {}

    def take(self, specs: tuple[JobSpec, ...]) -> Refused | None:
        times = sequence_times(self.truth, specs, self.gpu_type, self.time_scale)
        if isinstance(times, Refused):
            return times
        self.times = {**self.times, **times}
        for event in self.wake.values():  # a running entry looks whether it was abandoned
            event.set()
        return None

    async def compute(self, gpu: int, entry: TaskEntry, held: tuple[int, int],
                      last_job: JobId | None, upcoming: tuple[JobId, ...],
                      running: Running, ahead: TaskEntry | None = None) -> Computed | None:
        times = self.times[entry.job_id]
        run = entry_run(entry, times, self.clock(), last_job, self.switch_s)
        wake = self.wake.setdefault(gpu, asyncio.Event())
        while running():
            left = run.compute_end - self.clock()
            if left <= 0:
                return Computed(gpu, run.compute_start, run.compute_end, run.reported)
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), left)
        return None

    def staged(self, gpu: int) -> TaskKey | None:
        return None  # the world model's switch cost is the same either way

    async def deliver(self, entry: TaskEntry, held: tuple[int, int], done: Computed) -> None:
        assert done.synced is not None
        await asyncio.sleep(max(0.0, done.synced - self.clock()))

    def drop(self, job: JobId) -> None:
        self.times.pop(job, None)

    async def tidy(self, gpu: int) -> tuple[JobId, ...]:
        return ()  # the world model's times hold no memory on a GPU
