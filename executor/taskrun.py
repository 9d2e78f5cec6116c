"""The executor's task runner: it follows the Hare task sequences the
scheduler leader sends this server (``hops.v1.tasks.seq.<server_id>``)
and reports each entry it ran (``hops.v1.tasks.done.<server_id>.<job_id>``,
captured by stream ``HOPS_TASK_DONE``, message id
``<server>:<job>:<round>:<lo>``).
The rules are :mod:`executor.tasks`'; this shell decodes, keeps the time
and publishes.

* A message that does not decode is refused with the decoder's code and
  reason (an error record); a revision :class:`~executor.tasks.Follower`
  refuses is logged and recorded once with its code; a resend of the held
  revision is a no-op.
* One asyncio task per GPU index runs the GPU's entries in order: it waits
  for the entry's begin and for its job's earlier rounds on this server
  (a new revision, or another GPU's compute ending, wakes it to look
  again), then
  emulates the switch and the compute with the world model's times and,
  ``T^s`` later, publishes the ``task_done`` (a JetStream publish, retried;
  the executor's identity has no JetStream API, the stream captures it).
  ``started_at`` and ``ended_at`` are the compute's span on the wall clock
  the leader plans on (``time.time``); ``at`` is when the report was sent.
* The real backend has no resident trainers yet: every revision is refused
  with ``tasks_not_supported``, once per revision, and nothing runs.

A restarted executor holds nothing: it takes the leader's next resend, and
the entry it was running (not reported) is again the head of its GPU's
sequence, so it runs again. A revision that drops the job of a running
entry abandons it: its GPU stops at once and reports nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from nats.aio.msg import Msg
from structlog.typing import FilteringBoundLogger

from executor.backend import Backend
from executor.emulated import EmulatedBackend
from executor.publish import publish_retrying
from executor.tasks import (
    TASKS_NOT_SUPPORTED,
    Follower,
    Refused,
    TaskTimes,
    entry_run,
    key_of,
    sequence_times,
)
from services.runtime.service import ServiceContext
from shared import subjects
from shared.cluster import Server
from shared.events import TaskDone, TaskSequence, WireError, decode_task_event
from shared.ids import JobId
from shared.sequence import TaskEntry, TaskKey
from shared.wire import INVALID
from world.hare import SWITCH_S
from world.truth import GroundTruth

Clock = Callable[[], float]
SAID_MAX = 256  # refusals remembered, so that resends are not recorded again


class TaskRunner:
    """Follows this server's task sequences (module docstring); ``truth``
    None: the backend cannot run tasks."""

    def __init__(self, ctx: ServiceContext, server: Server, truth: GroundTruth | None,
                 time_scale: float, switch_s: float = SWITCH_S, clock: Clock = time.time) -> None:
        self.ctx = ctx
        self.server = server
        self.truth = truth
        self.time_scale = time_scale
        self.switch_s = switch_s / time_scale
        self.clock = clock
        self.log: FilteringBoundLogger = ctx.log.bind(server_id=server.id, part="tasks")
        self.subject = subjects.task_sequence(server.id)
        self.follower = Follower(server.id, server.gpus)
        self.times: dict[JobId, TaskTimes] = {}
        self.wake = {i: asyncio.Event() for i in range(server.gpus)}
        self.synced: dict[TaskKey, float] = {}  # entries computed here: their gradients sent
        self._said: set[tuple[int, int, str]] = set()  # the refusals recorded

    async def start(self) -> None:
        """Subscribe, and start one runner per GPU."""
        await self.ctx.nc.subscribe(self.subject, cb=self.on_message)
        await self.ctx.nc.flush()
        self.log.info("following task sequences", subject=self.subject,
                      runs=self.truth is not None, gpus=self.server.gpus)
        if self.truth is not None:
            for index in range(self.server.gpus):
                self.ctx.spawn(self._gpu(index), name=f"tasks-gpu-{index}")

    async def on_message(self, msg: Msg) -> None:
        try:
            seq = decode_task_event(msg.data)
        except WireError as e:
            await self.ctx.reporter.report(msg.subject, str(e), e.code, msg.data)
            return
        if not isinstance(seq, TaskSequence):
            await self.ctx.reporter.report(msg.subject, f"a {seq.__struct_config__.tag} "
                                           "is no task_sequence", INVALID, msg.data)
            return
        await self.offer(seq)

    async def offer(self, seq: TaskSequence) -> None:
        """Take ``seq``, or refuse it (module docstring)."""
        if self.truth is None:
            await self._refuse(seq, Refused(TASKS_NOT_SUPPORTED, (
                f"the {self.server.id} executor's backend cannot run Hare's tasks yet "
                "(resident trainers are a later step)")))
            return
        times = sequence_times(self.truth, seq.specs, self.server.gpu_type, self.time_scale)
        verdict = times if isinstance(times, Refused) else self.follower.offer(seq)
        if isinstance(verdict, Refused):
            await self._refuse(seq, verdict)
        elif verdict == "taken":
            assert not isinstance(times, Refused)
            self.times = {**self.times, **times}
            listed = {key_of(e) for es in self.follower.entries.values() for e in es}
            self.synced = {k: t for k, t in self.synced.items() if k in listed}
            self.log.info("task sequence taken", term=seq.term, revision=seq.revision,
                          policy=seq.policy, entries={g.gpu_index: len(g.entries)
                                                      for g in seq.gpus})
            for event in self.wake.values():
                event.set()

    async def _refuse(self, seq: TaskSequence, why: Refused) -> None:
        said = (seq.term, seq.revision, why.code)
        if said in self._said:  # a resend of what was refused
            return
        if len(self._said) >= SAID_MAX:  # bounded: a refusal may be recorded again
            self._said.clear()
        self._said.add(said)
        self.log.warning("task sequence refused", term=seq.term, revision=seq.revision,
                         code=why.code, reason=why.reason)
        await self.ctx.reporter.publish(self.subject, why.reason, why.code)

    async def _gpu(self, index: int) -> None:
        """Run GPU ``index``'s entries in order, one at a time."""
        wake, last_job = self.wake[index], None
        while not self.ctx.stopping.is_set():
            wake.clear()
            entry = self.follower.head(index)
            synced = None if entry is None else self._synced(entry)
            if entry is None or synced is None:  # nothing to run, or an earlier round runs
                await wake.wait()
                continue
            times = self.times[entry.job_id]
            run = entry_run(entry, times, max(self.clock(), synced), last_job, self.switch_s)
            if run.begin > self.clock():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), run.begin - self.clock())
                continue  # a new revision, or the begin came: look again
            key = key_of(entry)
            term, revision = self.follower.start(index, entry)
            last_job = entry.job_id  # the GPU switched to it, even if it is abandoned
            started = self.clock() + run.switch_s
            ended = started + (entry.hi - entry.lo) * times.compute_s
            if not await self._compute(index, key, ended):
                self.log.info("task abandoned", job_id=entry.job_id, round=entry.round,
                              lo=entry.lo, gpu_index=index)
                continue
            self.follower.finish(index)
            self.synced[key] = ended + times.sync_s
            for event in self.wake.values():  # a round's barrier may have lifted
                event.set()
            self.ctx.spawn(self._report(index, entry, (term, revision), (started, ended),
                                        ended + times.sync_s),
                           name=f"task-done-{entry.job_id}-{entry.round}-{entry.lo}")

    def _synced(self, entry: TaskEntry) -> float | None:
        """When the gradients of ``entry``'s job's earlier rounds on this
        server are sent (0: none listed); None while one is not computed."""
        keys = self.follower.barrier(entry)
        if any(k not in self.synced for k in keys):
            return None
        return max((self.synced[k] for k in keys), default=0.0)

    async def _compute(self, index: int, key: TaskKey, until: float) -> bool:
        """Emulate GPU ``index``'s switch and compute of ``key`` until
        ``until``; False when a revision abandoned it first."""
        wake = self.wake[index]
        while self.follower.runs(index, key):
            left = until - self.clock()
            if left <= 0:
                return True
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), left)
        return False

    async def _until(self, at: float) -> None:
        """Sleep until ``at`` on the clock (not a duration: no drift)."""
        await asyncio.sleep(max(0.0, at - self.clock()))

    async def _report(self, index: int, entry: TaskEntry, held: tuple[int, int],
                      span: tuple[float, float], sent: float) -> None:
        """Once the gradients are sent (at ``sent``), publish the entry's
        ``task_done``: computed over ``span`` under revision ``held``."""
        await self._until(sent)
        report = TaskDone(term=held[0], revision=held[1], job_id=entry.job_id,
                          round=entry.round, lo=entry.lo, hi=entry.hi, server_id=self.server.id,
                          gpu_index=index, started_at=span[0], ended_at=span[1],
                          at=self.clock())
        msg_id = subjects.task_done_id(self.server.id, entry.job_id, entry.round, entry.lo)
        log = self.log.bind(job_id=entry.job_id)
        subject = subjects.task_done(self.server.id, entry.job_id)
        if await publish_retrying(self.ctx.js, subject, report, msg_id, log):
            log.info("task done", round=entry.round, lo=entry.lo, hi=entry.hi, gpu_index=index,
                     started_at=span[0], ended_at=span[1], term=held[0], revision=held[1])


async def start_tasks(ctx: ServiceContext, server: Server, backend: Backend,
                      time_scale: float) -> TaskRunner:
    """The executor's hook: follow this server's task sequences, run on the
    emulated backend's world model, refused on any other backend."""
    truth = backend.truth if isinstance(backend, EmulatedBackend) else None
    runner = TaskRunner(ctx, server, truth, time_scale)
    await runner.start()
    return runner
