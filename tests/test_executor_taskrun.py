"""The executor's task runner (executor/taskrun.py) in-process, its bus
faked: a task whose script raised fails its job once, on the server's
report subject, and the work drops the job; a revision that no longer
names the job clears it; a backend without trainers refuses each revision
``tasks_not_supported``, once."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import structlog

from executor.taskrun import TaskRunner, task_work
from executor.tasks import TASKS_NOT_SUPPORTED
from executor.taskwork import Computed, TaskFailed
from services.runtime.service import ServiceContext
from services.runtime.settings import RuntimeSettings
from shared import events as ev
from shared import subjects
from shared.cluster import Server
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, TaskEntry

S = ServerId("solo")
BAD, GOOD = JobId("bad"), JobId("good")


class Bus:
    """What the runner publishes: JetStream messages and error records."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, bytes, str]] = []
        self.errors: list[tuple[str, str]] = []

    async def publish(self, subject: str, data: bytes, timeout: float | None = None,
                      headers: dict[str, str] | None = None, **_: Any) -> object:
        self.stored.append((subject, data, (headers or {}).get("Nats-Msg-Id", "")))
        return object()

    async def report(self, subject: str, error: str, code: str, data: bytes = b"") -> None:
        self.errors.append((subject, code))


class Work:
    """Entries of ``BAD`` raise ``task_failed``; the others compute at once."""

    def __init__(self) -> None:
        self.dropped: list[JobId] = []
        self.ran: list[tuple[JobId, int, int]] = []

    def take(self, specs: tuple[JobSpec, ...]) -> None:
        return None

    async def compute(self, gpu: int, entry: TaskEntry, *_: Any) -> Computed:
        self.ran.append((entry.job_id, entry.round, entry.lo))
        if entry.job_id == BAD:
            raise TaskFailed("task_failed", f"job bad round {entry.round}: RuntimeError: boom",
                             fails_job=True)
        return Computed(gpu, 0.0, 0.0, synced=0.0)

    async def deliver(self, *_: Any) -> None:
        return None

    def drop(self, job: JobId) -> None:
        self.dropped.append(job)

    async def tidy(self, gpu: int) -> tuple[JobId, ...]:
        return ()


def context(bus: Bus) -> ServiceContext:
    reporter = type("Reporter", (), {"publish": bus.report, "report": bus.report})()
    return ServiceContext("executor", RuntimeSettings(), cast(Any, None), cast(Any, bus),
                          structlog.get_logger(), cast(Any, reporter))


def spec(job: JobId) -> JobSpec:
    return JobSpec(job, "small-cnn", 8, 100, 240, requirements=(1,), sync_scale=2,
                   command=("python", "x.py"))


def revision(rev: int, *entries: TaskEntry) -> ev.TaskSequence:
    jobs = sorted({e.job_id for e in entries})
    return ev.TaskSequence(term=1, revision=rev, server_id=S, at=0.0,
                           gpus=(GpuTasks(0, entries),), specs=tuple(spec(j) for j in jobs))


async def test_a_script_that_raises_fails_its_job_once_and_its_later_entries_are_skipped(
) -> None:
    bus, work = Bus(), Work()
    ctx = context(bus)
    runner = TaskRunner(ctx, Server(S, GpuType("cpu"), 1), cast(Any, work), clock=lambda: 5.0)
    entries = (TaskEntry(BAD, 0, 0, 1, 0.0, 0.1), TaskEntry(GOOD, 0, 0, 2, 0.1, 0.2),
               TaskEntry(BAD, 0, 1, 2, 0.2, 0.3), TaskEntry(BAD, 1, 0, 2, 0.3, 0.4))
    await runner.offer(revision(1, *entries))
    gpu = asyncio.create_task(runner._gpu(0))
    for _ in range(200):
        if len(runner.follower.done) == len(entries):
            break
        await asyncio.sleep(0.01)
    ctx.stopping.set()
    runner.wake[0].set()
    await gpu
    await asyncio.gather(*ctx._tasks)
    assert work.ran == [(BAD, 0, 0), (GOOD, 0, 0)]  # bad's later entries here: skipped
    assert work.dropped == [BAD]
    failed = [(s, ev.decode_job_event(d), i) for s, d, i in bus.stored
              if s == subjects.reports(S, BAD)]
    assert len(failed) == 1
    _, event, msg_id = failed[0]
    assert msg_id == "bad:job_failed" and isinstance(event, ev.JobFailed)
    assert event.reason == "task_failed: job bad round 0: RuntimeError: boom (server solo, GPU 0)"
    assert (subjects.task_done(S, BAD), "task_failed") in bus.errors
    # the leader drops the job: a revision without it clears it, so that a
    # job submitted again under its id would run
    assert runner.failed == {BAD}
    await runner.offer(revision(2, entries[1]))
    assert runner.failed == set()


async def test_a_backend_without_trainers_refuses_each_revision_once() -> None:
    bus = Bus()
    ctx = context(bus)
    # a backend that is neither emulated nor real (Slurm's): no work, whatever the settings
    assert task_work(ctx, Server(S, GpuType("cpu"), 1), cast(Any, object()),
                     cast(Any, None)) is None
    runner = TaskRunner(ctx, Server(S, GpuType("cpu"), 1), None)
    first = revision(1, TaskEntry(GOOD, 0, 0, 1, 0.0, 0.1))
    for seq in (first, first, revision(2, TaskEntry(GOOD, 0, 0, 1, 0.0, 0.1))):
        await runner.offer(seq)
    assert bus.errors == [(subjects.task_sequence(S), TASKS_NOT_SUPPORTED)] * 2
    assert runner.follower.held is None  # nothing taken
