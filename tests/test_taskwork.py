"""The task runner's shell with a backend's work (executor.taskrun,
executor.taskwork), no bus: a stand-in work records what it is asked to
do. Each GPU's entries run in order; a ``task_done`` goes out only after
the work delivered the gradients; a job whose script raised
(``task_failed``) is recorded once, skipped, does not hold the GPU, and
fails the job (its ``job_failed`` once, the work dropping it); an
entry whose parameters did not come (``no_params``) is tried again; a
revision the work refuses (``not_task_ready``) changes nothing; a backend
without trainers refuses each revision ``tasks_not_supported``. Also:
the real Hare example's jobs load as tasks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog

from executor.realwork import RealWork
from executor.taskrun import TaskRunner, task_work
from executor.tasks import TASKS_NOT_SUPPORTED, Refused
from executor.taskwork import NO_PARAMS, Computed, Running, TaskFailed
from hops.trainer.api import load_task
from hops.trainer.protocol import TASK_FAILED
from hops.trainer.spec import NOT_TASK_READY, task_config, task_script
from shared import events as ev
from shared.cluster import Server
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, TaskEntry, TaskKey
from shared.specs import load_jobs

SID = ServerId("s")
GOOD, BAD, LATE, NOPE = JobId("good"), JobId("bad"), JobId("late"), JobId("nope")


def spec(job: JobId) -> JobSpec:
    return JobSpec(job, "m", 4, 10, 1000, requirements=(1,), sync_scale=3,
                   command=("python", "x.py"))


@dataclass
class Work:
    """The stand-in: ``bad`` raises, ``late`` lacks its parameters twice;
    ``log``: what it did, and the reports (shared with the context)."""

    log: list[str]
    late_tries: int = 0

    def take(self, specs: tuple[JobSpec, ...]) -> Refused | None:
        if any(s.id == NOPE for s in specs):
            return Refused(NOT_TASK_READY, "nope cannot run as tasks")
        return None

    async def compute(self, gpu: int, entry: TaskEntry, held: tuple[int, int],
                      last_job: JobId | None, upcoming: tuple[JobId, ...],
                      running: Running, ahead: TaskEntry | None = None) -> Computed | None:
        self.log.append(f"compute {entry.job_id} {entry.round} {entry.lo}")
        if entry.job_id == BAD:
            raise TaskFailed(TASK_FAILED, "the script raised", fails_job=True)
        if entry.job_id == LATE and self.late_tries < 2:
            self.late_tries += 1
            raise TaskFailed(NO_PARAMS, "no parameters yet")
        await asyncio.sleep(0.01)
        now = time.time()
        return Computed(gpu, now - 0.01, now)

    async def deliver(self, entry: TaskEntry, held: tuple[int, int], done: Computed) -> None:
        await asyncio.sleep(0.02)
        self.log.append(f"sent {entry.job_id} {entry.round} {entry.lo}")

    def staged(self, gpu: int) -> TaskKey | None:
        return None

    def drop(self, job: JobId) -> None:
        self.log.append(f"drop {job}")

    async def tidy(self, gpu: int) -> tuple[JobId, ...]:
        return ()


@dataclass
class Ctx:
    """What the runner uses of a service context."""

    trace: list[str]  # the work's log, and the reports
    published: list[tuple[str, str]] = field(default_factory=list)  # (subject, code)
    reports: list[str] = field(default_factory=list)
    verdicts: list[tuple[str, ev.Message, str]] = field(default_factory=list)  # job_failed
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    log: Any = field(default_factory=structlog.get_logger)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def reporter(self) -> Ctx:
        return self

    @property
    def js(self) -> Ctx:
        return self

    async def publish(self, subject: str, *args: Any, **kw: Any) -> Any:
        if subject.startswith("hops.v1.reports."):  # a JetStream publish, its id a header
            msg_id = (kw.get("headers") or {}).get("Nats-Msg-Id", "")
            self.verdicts.append((subject, ev.decode_job_event(args[0]), msg_id))
            return None
        if subject.startswith("hops.v1.tasks.done."):
            if len(args) >= 2 and isinstance(args[1], str):  # an error record
                self.published.append((subject, args[1]))
                return None
            done = ev.decode_task_event(args[0])
            assert isinstance(done, ev.TaskDone)
            self.reports.append(f"done {done.job_id} {done.round} {done.lo}")
            self.trace.append(self.reports[-1])
            return None
        self.published.append((subject, args[1]))  # the sequence subject's refusals
        return None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str = "") -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        return task


def revision(rev: int, entries: list[tuple[JobId, int, int, int]]) -> ev.TaskSequence:
    now = time.time()
    es = tuple(TaskEntry(j, r, lo, hi, now + 0.001 * i, now + 0.001 * (i + 1))
               for i, (j, r, lo, hi) in enumerate(entries))
    return ev.TaskSequence(term=1, revision=rev, server_id=SID, at=now,
                           gpus=(GpuTasks(0, es),), policy="hare",
                           specs=tuple(spec(j) for j in sorted({e.job_id for e in es})))


async def run(entries: list[tuple[JobId, int, int, int]], until: Callable[[Ctx], bool],
              extra: ev.TaskSequence | None = None) -> tuple[Ctx, Work]:
    shared: list[str] = []
    ctx, work = Ctx(shared), Work(shared)
    runner = TaskRunner(ctx, Server(SID, GpuType("cpu"), 1), work)  # type: ignore[arg-type]
    if extra is not None:
        await runner.offer(extra)
    await runner.offer(revision(2, entries))
    task = asyncio.create_task(runner._gpu(0))
    deadline = time.monotonic() + 10
    while not until(ctx) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    ctx.stopping.set()
    task.cancel()
    await asyncio.gather(task, *ctx.tasks, return_exceptions=True)
    return ctx, work


def test_a_report_follows_its_gradients_and_a_failed_job_does_not_hold_the_gpu() -> None:
    entries = [(GOOD, 0, 0, 1), (BAD, 0, 0, 1), (GOOD, 0, 1, 3), (BAD, 0, 1, 3), (BAD, 1, 0, 3)]
    ctx, work = asyncio.run(run(entries, lambda c: len(c.reports) == 2,
                                extra=revision(1, [(NOPE, 0, 0, 3)])))
    assert ctx.reports == ["done good 0 0", "done good 0 1"]
    for report in ctx.reports:  # each task_done after its gradients went
        assert work.log.index(report.replace("done", "sent")) < work.log.index(report)
    assert work.log.count("compute bad 0 0") == 1  # the job's later entries skipped
    assert not any(x.startswith("compute bad 0 1") or x.startswith("compute bad 1")
                   for x in work.log)
    codes = [code for _, code in ctx.published]
    assert codes == [NOT_TASK_READY, TASK_FAILED], ctx.published
    # the script raised: the job fails, once, on the server's report subject
    # (the monitor relays it), and the work drops it
    assert work.log.count("drop bad") == 1
    assert [(s, m) for s, _, m in ctx.verdicts] == [("hops.v1.reports.s.bad", "bad:job_failed")]
    failed = ctx.verdicts[0][1]
    assert isinstance(failed, ev.JobFailed)
    assert failed.reason == "task_failed: the script raised (server s, GPU 0)"


def test_a_revision_without_a_failed_job_forgets_it_failed() -> None:
    """The leader dropped it: submitted again under its id, it runs."""
    async def go() -> set[JobId]:
        runner = TaskRunner(Ctx([]), Server(SID, GpuType("cpu"), 1), Work([]))  # type: ignore[arg-type]
        await runner.offer(revision(1, [(BAD, 0, 0, 3), (GOOD, 0, 0, 3)]))
        runner.failed.add(BAD)
        await runner.offer(revision(2, [(BAD, 0, 0, 3), (GOOD, 0, 0, 3)]))
        assert runner.failed == {BAD}  # still named: still failed here
        await runner.offer(revision(3, [(GOOD, 0, 0, 3)]))
        return runner.failed

    assert asyncio.run(go()) == set()


def test_a_backend_without_trainers_refuses_each_revision_once() -> None:
    """The Slurm backend's (Slurm runs whole jobs): no work, and each
    revision refused ``tasks_not_supported`` once, whatever the resends."""
    async def go() -> Ctx:
        ctx = Ctx([])
        server = Server(SID, GpuType("cpu"), 1)
        assert task_work(ctx, server, object(), None) is None  # type: ignore[arg-type]
        runner = TaskRunner(ctx, server, None)  # type: ignore[arg-type]
        first = revision(1, [(GOOD, 0, 0, 3)])
        for seq in (first, first, revision(2, [(GOOD, 0, 0, 3)])):
            await runner.offer(seq)
        assert runner.follower.held is None  # nothing taken
        return ctx

    codes = [code for _, code in asyncio.run(go()).published]
    assert codes == [TASKS_NOT_SUPPORTED, TASKS_NOT_SUPPORTED]


def test_an_entry_without_its_parameters_is_tried_again_not_lost() -> None:
    entries = [(LATE, 0, 0, 3), (GOOD, 0, 0, 3)]
    ctx, work = asyncio.run(run(entries, lambda c: len(c.reports) == 2))
    assert ctx.reports == ["done late 0 0", "done good 0 0"]  # in the GPU's order
    assert work.log.count("compute late 0 0") == 3
    assert [code for _, code in ctx.published] == [NO_PARAMS, NO_PARAMS]


def test_the_real_hare_example_runs_as_tasks() -> None:
    """examples/jobs-hare-real.yaml: two relaxed jobs with commands a
    resident trainer (and the aggregator) can load, from the repository."""
    root = Path(__file__).resolve().parents[1]
    jobs = load_jobs(root / "examples" / "jobs-hare-real.yaml")
    assert len(jobs) == 2 and all(j.sync_scale > 1 and j.command for j in jobs)
    for job in jobs:
        task = load_task(root / task_script(job), task_config(job))
        assert sum(p.numel() for p in task.model.parameters()) == job.params


def test_a_job_that_cannot_run_as_tasks_fails_alone_and_the_revision_is_taken() -> None:
    # One job of a revision has no `python <script.py>` command: the real
    # work takes the revision for the others and fails that job (its first
    # entry raises a job fault), before asking the aggregator for anything.
    def no_pool(gpu: int) -> Any:
        raise AssertionError("no trainer is needed to refuse a job")

    work = RealWork(None, None, SID, no_pool, 1.0)  # type: ignore[arg-type]
    shell = JobSpec(JobId("shell"), "m", 4, 10, 1000, requirements=(1,), sync_scale=3,
                    command=("bash", "-c", "train"))
    assert work.take((shell, spec(GOOD))) is None
    assert set(work.specs) == {JobId("shell"), GOOD}
    entry = TaskEntry(JobId("shell"), 0, 0, 3, 0.0, 1.0)
    with pytest.raises(TaskFailed) as failed:
        asyncio.run(work.compute(0, entry, (1, 1), None, (), lambda: True))
    assert (failed.value.code, failed.value.fails_job) == (NOT_TASK_READY, True)
    assert "bash" in failed.value.words
