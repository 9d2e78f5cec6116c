"""The aggregator service (docs/hare.md §7, "Step 3b"): one
:class:`~hops.aggregator.Aggregator` per relaxed-sync job that a task
sequence names, the thin shell of :mod:`.rules` and :mod:`.jobs`.

* **Sequences** (``hops.v1.tasks.seq.*``, core NATS, the leader's resends):
  a relaxed job named for the first time is hosted, its model built from
  its spec by the script's ``hops_task``; each entry is a grant (:mod:`.rules`).
* **Gradients** (stream ``HOPS_GRADS``, followed from its start): chunks put
  back together; a report no grant admits waits
  ``HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S``, then is refused ``not_sequenced``;
  one a grant admits whose round is more than one ahead of the next to
  apply waits as long for it (then ``round_ahead``); the others are decoded
  (``bad_tensor``) and counted by the core,
  which applies each round once complete. A refusal is logged and recorded
  (``hops.v1.errors``) with its code, and changes nothing.
* **After each round applied**: a checkpoint (object ``<job>/checkpoint`` of
  ``hops_aggregator``: parameters, optimiser state, rounds applied, the
  grants and the spec), then ``round_applied`` on ``hops.v1.agg.applied.<job>``
  (message id ``<job>:<round>``); once the job's last round is applied, its
  parameters as object ``<job>/final``, saved before that round's
  ``round_applied`` (the leader ends a real job on it). A checkpoint is also
  written when a sequence brings new grants, and before a report that a
  grant not yet in it admits is counted.
* **Parameters**: ``hops.v1.agg.params.<job>`` answers, chunk by chunk, the
  parameters after the last round applied and that round count.
* **Job events** (``HOPS_JOBS``, each job's last event first): a
  ``job_finished`` job is dropped once its final parameters are saved; a
  cancelled or failed one at once.

**Shards** (``HOPS_AGGREGATOR_SHARD``, :mod:`.rules`): a replica hosts,
restores, answers and refuses for its shard's jobs only, and passes over
the rest.

**Restart** (kill -9): the jobs come back from their checkpoints, the
stream is read again from its start, and the chunks of rounds applied are
skipped: rounds after the checkpoint are applied again from the same
state with the same gradients, so nothing is applied twice. The last
round applied is published again (the kill may have come between the
checkpoint and the publish).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from hops.aggregator import ROUND_AHEAD, GradientReport
from hops.aggregator.codec import BadCheckpoint, decode_report
from hops.trainer.wire import BAD_TENSOR, BadTensor
from services.aggregator.jobs import Hosted, host, rehost
from services.aggregator.rules import (
    PARAMS_MOVED,
    UNKNOWN_JOB,
    grant_problem,
    grants_of,
    header_problem,
    relaxed_specs,
    shard_of,
)
from services.aggregator.settings import AggregatorSettings, aggregator_settings
from services.runtime.follow import follow_stream
from services.runtime.objects import object_names, put_object, read_retried
from services.runtime.retry import publish_retried
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import (
    JobCancelled,
    JobFailed,
    JobFinished,
    TaskSequence,
    WireError,
    decode_job_event,
    decode_task_event,
)
from shared.gradients import (
    Assembled,
    Chunks,
    ParamsReply,
    RoundApplied,
    checkpoint_name,
    decode_chunk,
    decode_params_request,
    encode,
    final_name,
)
from shared.ids import JobId
from shared.wire import INVALID

Clock = Callable[[], float]
BUCKET = subjects.OBJ_AGGREGATOR


class AggregatorService:
    """The service's state and handlers (module docstring)."""

    def __init__(self, ctx: ServiceContext, settings: AggregatorSettings,
                 clock: Clock = time.time) -> None:
        self.ctx = ctx
        self.settings = settings
        self.clock = clock
        self.log = ctx.log.bind(part="aggregator")
        self.jobs: dict[JobId, Hosted] = {}
        self.ended: set[JobId] = set()  # final saved, cancelled or failed: not hosted again
        self.unloadable: set[JobId] = set()  # their script cannot run as tasks (said once)
        self.chunks = Chunks()
        self.pending: list[tuple[float, Assembled]] = []
        self.next_seq = 1
        self.lock = asyncio.Lock()  # one handler at a time: a checkpoint write awaits

    def mine(self, job: JobId) -> bool:
        """Whether ``job`` is this replica's shard's (:func:`.rules.shard_of`)."""
        return shard_of(job, self.settings.shards) == self.settings.shard

    async def start(self) -> None:
        await self._restore()
        nc = self.ctx.nc
        await nc.subscribe(subjects.TASK_SEQ_ALL, cb=self.on_sequence)
        await nc.subscribe(subjects.AGG_PARAMS_ALL, cb=self.on_params)
        await self.ctx.js.subscribe(subjects.JOB_EVENTS_ALL, cb=self.on_job_event,
                                    ordered_consumer=True,
                                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        following = asyncio.Event()
        self.ctx.spawn(follow_stream(nc, self.ctx.js, subjects.STREAM_GRADS.name,
                                     [subjects.GRADS_ALL], self.on_chunk,
                                     lambda: self.next_seq, self.ctx.stopping, self.log,
                                     following), name="grads")
        self.ctx.spawn(self._expire(), name="unsequenced")
        await following.wait()
        self.log.info("aggregating", jobs=sorted(self.jobs), ended=len(self.ended),
                      shard=f"{self.settings.shard}/{self.settings.shards}")

    async def _restore(self) -> None:
        names = await object_names(self.ctx.js, BUCKET)
        self.ended |= {JobId(n.rpartition("/")[0]) for n in names if n.endswith("/final")}
        for name in names:
            job = JobId(name.rpartition("/")[0])
            if name != checkpoint_name(job) or job in self.ended or not self.mine(job):
                continue
            data = await read_retried(self.ctx.js, BUCKET, name)
            if data is None:
                continue
            try:
                hosted = await asyncio.to_thread(rehost, data, self.settings.root)
            except (BadCheckpoint, BadTensor, ValueError, OSError) as e:
                await self._refuse(subjects.OBJ_AGGREGATOR, "bad_checkpoint",
                                   f"checkpoint {name}: {e}")
                continue
            self.jobs[job] = hosted
            self.log.info("job restored", job_id=job, applied=hosted.aggregator.applied,
                          grants=len(hosted.grants))
            # Killed between the checkpoint and the publish (or the final):
            # the last round applied again (its message id makes a repeat
            # count once; the leader takes a round once whatever comes twice).
            if hosted.aggregator.applied:
                await self._publish_applied(hosted, (hosted.aggregator.applied - 1,),
                                            "round applied published again")

    async def _refuse(self, subject: str, code: str, reason: str, **kw: object) -> None:
        self.log.warning("refused", subject=subject, code=code, reason=reason, **kw)
        await self.ctx.reporter.publish(subject, reason, code)

    # --- sequences: jobs and grants ----------------------------------------

    async def on_sequence(self, msg: Msg) -> None:
        try:
            seq = decode_task_event(msg.data)
        except WireError:
            return  # refused and recorded by the executor it is for, once is enough
        if not isinstance(seq, TaskSequence):
            return
        async with self.lock:
            await self._take(seq)
            await self._retry_pending()

    async def _take(self, seq: TaskSequence) -> None:
        specs = {s.id: s for s in seq.specs}
        for job, grants in grants_of(seq).items():
            if (job in self.ended or job in self.unloadable or job not in relaxed_specs(seq)
                    or not self.mine(job)):
                continue
            hosted = self.jobs.get(job)
            if hosted is None and not specs[job].command:  # emulated: no model to aggregate
                self.unloadable.add(job)
                self.log.info("job not aggregated: it has no command", job_id=job)
                continue
            if hosted is None:
                try:
                    hosted = await asyncio.to_thread(host, specs[job], self.settings.root)
                except (ValueError, OSError, ImportError) as e:
                    self.unloadable.add(job)
                    await self._refuse(msg_subject(seq), getattr(e, "code", "not_task_ready"),
                                       f"job {job}: {e}", job_id=job)
                    continue
                self.jobs[job] = hosted
                self.log.info("job hosted", job_id=job, sync_scale=hosted.spec.sync_scale,
                              rounds=hosted.rounds)
            if hosted.grant(grants):
                # Saved at once: the leader stops listing an entry once it is
                # reported, so a grant seen only before a restart is lost with
                # it when no report of it came before the kill.
                await self._checkpoint(hosted)

    # --- gradients -----------------------------------------------------------

    async def on_chunk(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq < self.next_seq:  # delivered again after a reconnect
            return
        self.next_seq = seq + 1
        try:
            server, job, round_ = subjects.grads_tokens(msg.subject)
        except subjects.SubjectError as e:
            if self.settings.shard == 0:  # no job to say whose: shard 0 records it
                await self._refuse(msg.subject, INVALID, str(e))
            return
        if not self.mine(job):
            return
        try:
            chunk = decode_chunk(msg.data)
        except WireError as e:
            await self._refuse(msg.subject, e.code, str(e))
            return
        if (why := header_problem((server, job, round_), chunk)) is not None:
            await self._refuse(msg.subject, *why, server_id=server)
            return
        async with self.lock:
            hosted = self.jobs.get(job)
            if job in self.ended or (hosted is not None and round_ < hosted.aggregator.applied):
                return  # a replay of a round applied, or of a job done
            try:
                report = self.chunks.add(server, chunk)
            except ValueError as e:
                await self._refuse(msg.subject, INVALID, str(e), server_id=server)
                return
            if report is not None and not await self._judge(report):
                self.pending.append((self.clock(), report))

    async def _judge(self, report: Assembled) -> bool:
        """Count ``report`` or refuse it; False when it must wait for a grant."""
        head, server = report.header, report.server_id
        hosted = self.jobs.get(head.job_id)
        if hosted is None or grant_problem(hosted.grants, server, head) is not None:
            return False
        if head.round > hosted.aggregator.applied + 1:  # an earlier round's report waits
            return False
        subject = subjects.grads(server, head.job_id, head.round)
        if hosted.unsaved((server, head.round, head.lo, head.hi)):
            await self._checkpoint(hosted)  # the grant, kept before what it admits counts
        try:
            grads = await asyncio.to_thread(decode_report, report.payload, head.hi - head.lo)
        except BadTensor as e:
            await self._refuse(subject, BAD_TENSOR, str(e), server_id=server)
            return True
        received = hosted.aggregator.receive(GradientReport(
            head.job_id, head.round, head.lo, head.hi, grads))
        if received.outcome == "refused":
            await self._refuse(subject, received.code, received.reason, server_id=server)
        elif received.outcome == "duplicate":
            self.log.info("duplicate gradients", job_id=head.job_id, reason=received.reason)
        else:
            self.log.info("gradients counted", job_id=head.job_id, round=head.round,
                          lo=head.lo, hi=head.hi, server_id=server, counted=received.counted)
        if received.applied:
            await self._applied(hosted, received.applied)
        return True

    async def _retry_pending(self) -> None:
        waiting, self.pending = self.pending, []
        for since, report in waiting:
            if report.header.job_id in self.ended:
                continue
            if not await self._judge(report):
                self.pending.append((since, report))

    async def _expire(self) -> None:
        wait = self.settings.unsequenced_wait_s
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(min(max(wait / 4, 0.05), 0.5))
            now = self.clock()
            async with self.lock:
                late = [p for p in self.pending if now - p[0] >= wait]
                self.pending = [p for p in self.pending if now - p[0] < wait]
            for _, report in late:
                await self._refuse_late(report)

    async def _refuse_late(self, report: Assembled) -> None:
        """A report that waited too long: for a grant, or for its round."""
        head, server = report.header, report.server_id
        hosted = self.jobs.get(head.job_id)
        why = grant_problem(set() if hosted is None else hosted.grants, server, head)
        if why is None:
            assert hosted is not None
            why = (ROUND_AHEAD, f"round {head.round} waited for round "
                   f"{hosted.aggregator.applied} to be applied")
        await self._refuse(subjects.grads(server, head.job_id, head.round), *why,
                           server_id=server)

    # --- rounds applied, checkpoints, the end -----------------------------

    async def _checkpoint(self, hosted: Hosted) -> None:
        data = await asyncio.to_thread(hosted.checkpoint)
        await put_object(self.ctx.js, BUCKET, checkpoint_name(hosted.job_id), data)

    async def _applied(self, hosted: Hosted, rounds: tuple[int, ...]) -> None:
        job = hosted.job_id
        self.chunks.drop(job, hosted.aggregator.applied)
        await self._checkpoint(hosted)
        await self._publish_applied(hosted, rounds)
        await self._retry_pending()  # reports of the rounds now next

    async def _publish_applied(self, hosted: Hosted, rounds: tuple[int, ...],
                               event: str = "round applied") -> None:
        """Publish ``rounds`` applied; the job's final parameters are saved
        before its last round is published: the leader ends a real job on
        that round, so a job that ended has its final parameters."""
        job = hosted.job_id
        if hosted.done:
            data = await asyncio.to_thread(hosted.final)
            await put_object(self.ctx.js, BUCKET, final_name(job), data)
            self.log.info("final parameters saved", job_id=job, rounds=hosted.rounds)
        for r in rounds:
            await publish_retried(self.ctx.js, subjects.agg_applied(job),
                                  encode(RoundApplied(job_id=job, round=r, at=self.clock())),
                                  msg_id=f"{job}:{r}")
            self.log.info(event, job_id=job, round=r)
        if hosted.done and hosted.finished:
            self._drop(job, "finished")

    def _drop(self, job: JobId, why: str) -> None:
        self.jobs.pop(job, None)
        self.ended.add(job)
        self.pending = [p for p in self.pending if p[1].header.job_id != job]
        self.log.info("job dropped", job_id=job, why=why)

    async def on_job_event(self, msg: Msg) -> None:
        try:
            event = decode_job_event(msg.data)
        except WireError:
            return  # the stream's own readers report it
        async with self.lock:
            hosted = self.jobs.get(event.job_id)
            if isinstance(event, JobCancelled | JobFailed) and hosted is not None:
                self._drop(event.job_id, str(event.__struct_config__.tag))
            elif isinstance(event, JobFinished) and hosted is not None:
                hosted.finished = True
                if hosted.done:  # its final parameters are saved already
                    self._drop(event.job_id, "finished")

    # --- parameters ------------------------------------------------------

    async def on_params(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            req = decode_params_request(msg.data)
        except WireError as e:
            await msg.respond(encode(ParamsReply(ok=False, code=e.code, error=str(e))))
            return
        if not self.mine(req.job_id):
            return  # its shard answers
        async with self.lock:
            hosted = self.jobs.get(req.job_id)
            params = None if hosted is None else hosted.params()
        if params is None:
            reply = ParamsReply(ok=False, job_id=req.job_id, code=UNKNOWN_JOB,
                                error=f"job {req.job_id} is not hosted here")
        elif req.round not in (-1, params[0]):
            reply = ParamsReply(ok=False, job_id=req.job_id, round=params[0], code=PARAMS_MOVED,
                                error=f"round {req.round} asked, {params[0]} applied now")
        elif req.chunk >= len(params[1]):
            reply = ParamsReply(ok=False, job_id=req.job_id, code=INVALID,
                                error=f"chunk {req.chunk} of {len(params[1])}")
        else:
            reply = ParamsReply(ok=True, job_id=req.job_id, round=params[0], chunk=req.chunk,
                                chunks=len(params[1]), data=params[1][req.chunk])
        await msg.respond(encode(reply))


def msg_subject(seq: TaskSequence) -> str:
    return subjects.task_sequence(seq.server_id)


async def run(ctx: ServiceContext) -> None:
    """The service's main: settings from the environment, then serve."""
    service = AggregatorService(ctx, aggregator_settings(os.environ))
    await service.start()
    await ctx.stopping.wait()
