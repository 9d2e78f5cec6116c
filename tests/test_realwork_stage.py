"""The real executor stages a GPU's next entry while one computes
(executor.realwork, executor.taskrun; docs/hare.md §7, step 4b), against a
stand-in pool that records its calls: the next entry is sent to the
trainers before the running one's result is awaited, only when the shell
offers it (its barrier met, the GPU's next) and its round's parameters are
at hand; then it is not sent again; a staged entry the shell does not run
next is abandoned (its result read and dropped) before the next one is
sent. The shell offers the next entry only when it may start at once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import torch

from executor.realwork import RealWork
from executor.taskrun import TaskRunner
from executor.trainers import TaskResult, TrainerRefused
from hops.trainer.protocol import NOT_TASK_READY
from shared.cluster import Server
from shared.ids import GpuType
from shared.sequence import TaskEntry
from tests.test_taskwork import GOOD, LATE, SID, Ctx, Work, revision, spec

A = TaskEntry(GOOD, 0, 0, 1, 0.0, 1.0)
B = TaskEntry(LATE, 0, 0, 3, 0.0, 1.0)
C = TaskEntry(GOOD, 1, 0, 3, 0.0, 1.0)


class Pool:
    """Records ``stage`` and ``finish``; a task's gradient names its entry."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.jobs: dict[str, Any] = {}
        self.log: list[str] = []
        self.refuse = refuse

    def add_job(self, job: str, script: str, config: Any, tenant: str = "") -> None:
        self.jobs[job] = script

    def stage(self, job: str, round_: int, lo: int, hi: int, sync_scale: int,
              params: Any, upcoming: Any = ()) -> str:
        if job in self.refuse:
            raise TrainerRefused(NOT_TASK_READY, "cannot load")
        self.log.append(f"stage {job} {round_} {lo}")
        return f"{job} {round_} {lo}"

    def finish(self, pending: str) -> TaskResult:
        self.log.append(f"finish {pending}")
        t = time.monotonic()
        return TaskResult(({"g": torch.tensor(float(len(self.log)))},), 0, t, t, t, t, 0.0,
                          False, False, 1)


class Bus:
    """An aggregator that never answers."""

    async def request(self, *args: Any, **kw: Any) -> Any:
        raise TimeoutError("no aggregator")


def work_on(pool: Pool) -> RealWork:
    def make(gpu: int) -> Any:
        return pool

    work = RealWork(Bus(), None, SID, make, 1.0)  # type: ignore[arg-type]
    assert work.take((spec(GOOD), spec(LATE))) is None
    work.params = {GOOD: (0, {}), LATE: (0, {})}  # round 0's, at hand
    return work


async def compute(work: RealWork, entry: TaskEntry, ahead: TaskEntry | None) -> Any:
    return await work.compute(0, entry, (1, 1), None, (), lambda: True, ahead)


def test_the_next_entry_is_staged_before_the_running_one_ends_and_sent_once() -> None:
    pool = Pool()
    work = work_on(pool)

    async def go() -> None:
        await compute(work, A, B)
        assert pool.log == ["stage good 0 0", "stage late 0 0", "finish good 0 0"]
        assert work.staged(0) == ("late", 0, 0)
        done = await compute(work, B, None)
        assert pool.log[3:] == ["finish late 0 0"]  # not sent again
        assert done.gradients[0]["g"].item() == 4 and done.staged  # its own result
        assert work.staged(0) is None and work.abandoned == 0

    asyncio.run(go())


def test_a_staged_entry_the_shell_does_not_run_next_is_abandoned_first() -> None:
    pool = Pool()
    work = work_on(pool)
    work.params[GOOD] = (1, {})  # C's round

    async def go() -> None:
        await compute(work, TaskEntry(LATE, 0, 1, 2, 0.0, 1.0), B)
        del pool.log[:]
        done = await compute(work, C, None)  # a revision dropped B
        assert pool.log == ["finish late 0 0", "stage good 1 0", "finish good 1 0"]
        assert done.gradients[0]["g"].item() == 3 and not done.staged  # C's, not B's
        assert work.abandoned == 1 and work.staged(0) is None

    asyncio.run(go())


def test_nothing_is_staged_without_its_parameters_or_its_model() -> None:
    async def go() -> None:
        pool = Pool()
        work = work_on(pool)
        work.params.pop(LATE)  # not kept, and the aggregator does not answer
        await compute(work, A, B)
        assert pool.log == ["stage good 0 0", "finish good 0 0"] and work.staged(0) is None
        refusing = Pool(frozenset({LATE}))  # its model cannot be loaded: left to its turn
        work = work_on(refusing)
        await compute(work, A, B)
        assert refusing.log == ["stage good 0 0", "finish good 0 0"]
        assert work.staged(0) is None

    asyncio.run(go())


def test_the_shell_offers_the_next_entry_only_when_it_may_start_at_once() -> None:
    async def go() -> list[TaskEntry | None]:
        runner = TaskRunner(Ctx([]), Server(SID, GpuType("cpu"), 1), Work([]))  # type: ignore[arg-type]
        await runner.offer(revision(1, [(GOOD, 0, 0, 1), (LATE, 0, 0, 3), (GOOD, 1, 0, 3)]))
        first, second, third = runner.follower.entries[0]
        offered = []
        runner.follower.start(0, first)
        offered.append(runner._ahead(0))  # no earlier round: yes
        runner.follower.finish(0)
        runner.follower.start(0, second)
        offered.append(runner._ahead(0))  # its round 0 not sent yet: no
        runner.synced[(GOOD, 0, 0)] = time.time()
        offered.append(runner._ahead(0))  # sent: yes
        runner.failed.add(GOOD)
        offered.append(runner._ahead(0))  # its job failed: no
        runner.failed.clear()
        held = msgspec.structs.replace(third, hold=True, start_s=time.time() + 60)
        runner.follower.entries[0] = (first, second, held)
        offered.append(runner._ahead(0))  # held for a later start: no
        return offered

    assert [None if e is None else (e.job_id, e.round) for e in asyncio.run(go())] == [
        (LATE, 0), None, (GOOD, 1), None, None]
