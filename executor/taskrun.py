"""The executor's task runner: it follows the Hare task sequences the
scheduler leader sends this server (``hops.v1.tasks.seq.<server_id>``)
and reports each entry it ran (``hops.v1.tasks.done.<server_id>.<job_id>``,
captured by stream ``HOPS_TASK_DONE``, message id
``<server>:<job>:<round>:<lo>``).
The rules are :mod:`executor.tasks`'; the work of an entry is the
backend's (:mod:`executor.taskwork`); this shell decodes, keeps the time
and publishes. It is one for both backends.

* A message that does not decode is refused with the decoder's code and
  reason (an error record); a revision :class:`~executor.tasks.Follower`
  or the work refuses is logged and recorded once with its code; a resend
  of the held revision changes nothing but its rounds applied (each count
  only growing).
* One asyncio task per GPU index runs the GPU's entries in order: it waits
  for the entry's begin, for its job's earlier rounds on this server and
  for their being applied (a new revision, the leader's resend with more
  rounds applied, or another GPU's entry ending, wakes it to look
  again), then has the backend's work run it: the world model's switch
  and compute times on the emulated backend (:class:`~executor.taskwork.
  EmulatedWork`), the round's parameters from the job's aggregator and a
  resident trainer on the real one (:mod:`executor.realwork`), told the
  GPU's next entry when it may start as soon as this one's compute ends
  (the next in the held revision, its job not failed, its barrier met, no
  later start held): the real work stages it on the trainers meanwhile, and
  a staged entry is not held to its planned start. Once the
  work has sent the gradients (emulated: ``T^s`` after the compute) it
  publishes the ``task_done`` (a JetStream publish, retried; the
  executor's identity has no JetStream API, the stream captures it).
  ``started_at`` and ``ended_at`` are the compute's span on the wall clock
  the leader plans on (``time.time``); ``at`` is when the report was sent.
* An entry whose work fails is recorded (an error record with the code,
  on the subject of its ``task_done``) and: tried again when its
  parameters did not come in time (``no_params``: it stays its GPU's
  head); else skipped, with the job's later entries here. When the job's
  own script raised (``task_failed``, the work's ``fails_job``) its round
  can never complete, so the job fails: its ``job_failed``
  (:func:`executor.tasks.task_job_failed`: the code and the script's
  error) goes where a real job's failed process's goes, the server's
  ``hops.v1.reports.<server>.<job>``, message id ``<job>:job_failed``
  (one verdict however many GPUs fail it), and the monitor relays it only
  for a job sequenced on this server. The work drops the job (its models
  leave the trainers). A revision that no longer names a failed job
  forgets it was failed here: the leader dropped it.
* A backend with neither the world model nor trainers (the Slurm
  backend's: Slurm runs whole jobs) refuses every revision with
  ``tasks_not_supported``, once per revision, and nothing runs.

A restarted executor holds nothing: it takes the leader's next resend, and
the entry it was running (not reported) is again the head of its GPU's
sequence, so it runs again. A revision that drops the job of a running
entry abandons it: its GPU stops (the emulated one at once, a trainer
when its task ends) and reports nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nats.aio.msg import Msg
from structlog.typing import FilteringBoundLogger

from executor.backend import Backend
from executor.emulated import EmulatedBackend
from executor.publish import publish_retrying
from executor.real import RealBackend
from executor.settings import ExecutorSettings
from executor.tasks import TASKS_NOT_SUPPORTED, Follower, Refused, key_of, task_job_failed
from executor.taskwork import NO_PARAMS, Computed, EmulatedWork, TaskFailed, TaskWork
from services.runtime.service import ServiceContext
from shared import subjects
from shared.cluster import Server
from shared.events import JobFailed, TaskDone, TaskSequence, WireError, decode_task_event
from shared.ids import JobId
from shared.sequence import TaskEntry, TaskKey
from shared.wire import INVALID

if TYPE_CHECKING:  # torch comes with the real backend only
    from executor.trainers import TrainerPool

Clock = Callable[[], float]
SAID_MAX = 256  # refusals remembered, so that resends are not recorded again


class TaskRunner:
    """Follows this server's task sequences (module docstring); ``work``
    None: the backend cannot run tasks."""

    def __init__(self, ctx: ServiceContext, server: Server, work: TaskWork | None,
                 clock: Clock = time.time) -> None:
        self.ctx = ctx
        self.server = server
        self.work = work
        self.clock = clock
        self.log: FilteringBoundLogger = ctx.log.bind(server_id=server.id, part="tasks")
        self.subject = subjects.task_sequence(server.id)
        self.follower = Follower(server.id, server.gpus)
        self.wake = {i: asyncio.Event() for i in range(server.gpus)}
        self.synced: dict[TaskKey, float] = {}  # entries computed here: their gradients sent
        self._said: set[tuple[int, int, str]] = set()  # the refusals recorded
        self.failed: set[JobId] = set()  # jobs whose script raised: their entries are skipped

    async def start(self) -> None:
        """Subscribe, and start one runner per GPU."""
        await self.ctx.nc.subscribe(self.subject, cb=self.on_message)
        await self.ctx.nc.flush()
        self.log.info("following task sequences", subject=self.subject,
                      runs=self.work is not None, gpus=self.server.gpus)
        if self.work is not None:
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
        if self.work is None:
            await self._refuse(seq, Refused(TASKS_NOT_SUPPORTED, (
                f"the {self.server.id} executor's backend cannot run Hare's tasks "
                "(it has no resident trainers)")))
            return
        if self.follower.held == (seq.term, seq.revision):  # the leader's resend
            if self.follower.note_applied(seq):  # a round applied: a held entry may start
                self._wake_all()
            return
        checked = self.work.take(seq.specs)
        verdict = checked if checked is not None else self.follower.offer(seq)
        if isinstance(verdict, Refused):
            await self._refuse(seq, verdict)
        elif verdict == "taken":
            listed = {key_of(e) for es in self.follower.entries.values() for e in es}
            self.synced = {k: t for k, t in self.synced.items() if k in listed}
            self.failed &= set(self.follower.specs)  # a job dropped by the leader
            self.log.info("task sequence taken", term=seq.term, revision=seq.revision,
                          policy=seq.policy, entries={g.gpu_index: len(g.entries)
                                                      for g in seq.gpus})
            self._wake_all()

    def _wake_all(self) -> None:
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
        assert self.work is not None
        wake, last_job = self.wake[index], None
        while not self.ctx.stopping.is_set():
            wake.clear()
            for job in await self.work.tidy(index):  # between entries: a failed job's models go
                self.log.info("task job forgotten", job_id=job, gpu_index=index)
            entry = self.follower.head(index)
            if entry is not None and entry.job_id in self.failed:  # its rounds cannot end
                self.follower.start(index, entry)
                self.follower.finish(index)
                continue
            synced = None if entry is None else self._synced(entry)
            if entry is None or synced is None or not self.follower.may_start(entry):
                # nothing to run, or an earlier round runs or is not applied yet
                await wake.wait()
                continue
            key = key_of(entry)
            # a staged entry computes already (its barrier was met): no planned start to wait for
            staged = self.work.staged(index) == key
            begin = synced if staged else max(self.clock(), synced, entry.start_s)
            if begin > self.clock():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), begin - self.clock())
                continue  # a new revision, or the begin came: look again
            held = self.follower.start(index, entry)
            last, last_job = last_job, entry.job_id  # switched, even if it is abandoned
            try:
                done = await self.work.compute(index, entry, held, last, self._upcoming(index),
                                               functools.partial(self.follower.runs, index, key),
                                               self._ahead(index))
            except TaskFailed as e:
                await self._failed(index, entry, e)
                continue
            if done is None:
                self.log.info("task abandoned", job_id=entry.job_id, round=entry.round,
                              lo=entry.lo, gpu_index=index)
                continue
            self.follower.finish(index)
            if done.synced is not None:
                self.synced[key] = done.synced
            self._wake_all()  # a round's barrier may have lifted
            self.ctx.spawn(self._report(index, entry, held, done),
                           name=f"task-done-{entry.job_id}-{entry.round}-{entry.lo}")

    def _later(self, index: int) -> list[TaskEntry]:
        """GPU ``index``'s entries after its running one, in order."""
        return [e for e in self.follower.entries.get(index, ())
                if key_of(e) not in self.follower.done
                and self.follower.running.get(index) != key_of(e)]

    def _upcoming(self, index: int) -> tuple[JobId, ...]:
        """The jobs of GPU ``index``'s entries after its running one."""
        return tuple(e.job_id for e in self._later(index))

    def _ahead(self, index: int) -> TaskEntry | None:
        """GPU ``index``'s entry after its running one, when it may start as
        that one's compute ends: its job not failed, its barrier met (its
        earlier rounds' gradients sent), and not held for a later start."""
        now, later = self.clock(), self._later(index)
        nxt = later[0] if later else None
        if (nxt is None or nxt.job_id in self.failed or (nxt.hold and nxt.start_s > now)
                or not self.follower.may_start(nxt)):
            return None
        synced = self._synced(nxt)
        return nxt if synced is not None and synced <= now else None

    async def _failed(self, index: int, entry: TaskEntry, e: TaskFailed) -> None:
        """An entry whose work failed: tried again (``no_params``: it stays the
        GPU's head) or skipped, recorded either way."""
        if e.code == NO_PARAMS:
            self.follower.release(index)
        else:  # the job's later entries here are skipped, not waited on
            self.failed.add(entry.job_id)
            if self.follower.runs(index, key_of(entry)):
                self.follower.finish(index)
            self._wake_all()
        self.log.warning("task failed", job_id=entry.job_id, round=entry.round, lo=entry.lo,
                         gpu_index=index, code=e.code, reason=e.words, fails_job=e.fails_job)
        await self.ctx.reporter.publish(subjects.task_done(self.server.id, entry.job_id),
                                        e.words, e.code)
        if e.fails_job:
            assert self.work is not None
            self.work.drop(entry.job_id)
            self._wake_all()  # each GPU's runner tidies its trainers
            failed = task_job_failed(entry.job_id, e.code, e.words, self.server.id, index,
                                     self.clock())
            log = self.log.bind(job_id=entry.job_id)
            # in the background, retried: the GPU goes on with its next entry
            self.ctx.spawn(self._publish_failed(failed, log), name=f"failed-{entry.job_id}")

    async def _publish_failed(self, failed: JobFailed, log: FilteringBoundLogger) -> None:
        subject = subjects.reports(self.server.id, failed.job_id)
        if await publish_retrying(self.ctx.js, subject, failed, f"{failed.job_id}:job_failed",
                                  log):
            log.warning("job failed", reason=failed.reason)

    def _synced(self, entry: TaskEntry) -> float | None:
        """When the gradients of ``entry``'s job's earlier rounds on this
        server are sent (0: none listed); None while one is not sent (or,
        emulated, not computed)."""
        keys = self.follower.barrier(entry)
        if any(k not in self.synced for k in keys):
            return None
        return max((self.synced[k] for k in keys), default=0.0)

    async def _report(self, index: int, entry: TaskEntry, held: tuple[int, int],
                      done: Computed) -> None:
        """Once the work has sent the gradients, publish the entry's
        ``task_done``: computed over ``done``'s span under revision ``held``."""
        assert self.work is not None
        log = self.log.bind(job_id=entry.job_id)
        # Gradients that cannot be sent stop the executor (ctx.spawn): a
        # restarted one runs the unreported entry again, nothing is lost.
        await self.work.deliver(entry, held, done)
        self.synced[key_of(entry)] = self.synced.get(key_of(entry), self.clock())
        self._wake_all()
        report = TaskDone(term=held[0], revision=held[1], job_id=entry.job_id,
                          round=entry.round, lo=entry.lo, hi=entry.hi, server_id=self.server.id,
                          gpu_index=index, started_at=done.started, ended_at=done.ended,
                          at=self.clock())
        msg_id = subjects.task_done_id(self.server.id, entry.job_id, entry.round, entry.lo)
        subject = subjects.task_done(self.server.id, entry.job_id)
        if await publish_retrying(self.ctx.js, subject, report, msg_id, log):
            log.info("task done", round=entry.round, lo=entry.lo, hi=entry.hi, gpu_index=index,
                     started_at=done.started, ended_at=done.ended, term=held[0],
                     revision=held[1], staged=done.staged)


def task_work(ctx: ServiceContext, server: Server, backend: Backend,
              settings: ExecutorSettings) -> TaskWork | None:
    """The backend's work of an entry; None for a backend without trainers."""
    if isinstance(backend, EmulatedBackend):
        return EmulatedWork(backend.truth, server.gpu_type, settings.time_scale, time.time)
    if isinstance(backend, RealBackend):
        # torch comes with the real backend only: the emulated executor's image has none
        from executor.realwork import RealWork

        return RealWork(ctx.nc, ctx.js, server.id, functools.partial(trainer_pool, settings),
                        settings.task_params_wait_s)
    return None


def trainer_pool(settings: ExecutorSettings, gpu: int) -> TrainerPool:
    """GPU ``gpu``'s resident trainers as the settings say: threads as a
    real job's (one on a declared CPU device, the GPU's own else)."""
    from executor.trainers import TrainerPool  # torch: the real backend's alone

    cores = settings.affinity[gpu] if gpu < len(settings.affinity) else ()
    device = _device(gpu)
    return TrainerPool(settings.trainers_per_gpu, device=device, cores=cores,
                       threads=settings.threads or (1 if device == "cpu" else 0),
                       deterministic=settings.deterministic_trainers)


def _device(gpu: int) -> str:
    """A GPU's torch device: ``cuda:<gpu>`` where CUDA is, else the CPU (a
    declared device: one core stands in for a GPU)."""
    import torch  # the emulated executor needs none of it

    return f"cuda:{gpu}" if torch.cuda.is_available() else "cpu"


async def start_tasks(ctx: ServiceContext, server: Server, backend: Backend,
                      settings: ExecutorSettings) -> TaskRunner:
    """The executor's hook: follow this server's task sequences with the
    backend's work (refused on a backend without trainers)."""
    runner = TaskRunner(ctx, server, task_work(ctx, server, backend, settings))
    await runner.start()
    return runner
