"""The estimator service: answers ``hops.v1.estimate`` from the multi-layer
throughput database (Hops §3.3, §3.5).

Every replica keeps a whole :class:`~estimation.database.ThroughputDatabase`
of its own, fed by *every* message of stream ``HOPS_SAMPLES`` in stream order
(``profile_reported`` → ``record_profile``, ``sample_reported`` →
``record_sample``) through an ordered consumer that starts at the stream's
first message (and, after a NATS restart, again after the last message
applied: :func:`~services.runtime.follow.follow_stream`): replicas do not
share a durable consumer, since each needs every sample. Replicas therefore
agree, and one restarted rebuilds the same database from the stream.

A replica joins queue group ``estimator`` on ``hops.v1.estimate`` only once
it has caught up with the stream as it was when it started, so a request is
never answered from a partial database. An ``estimate_request`` is answered
with one :class:`~shared.estimate.JobEstimate` per job that has a profile
(``estimate_job`` over the request's cluster); a job that cannot be
estimated is left out and logged. A bad request gets a failed
``estimate_reply`` and an ``error_record``. A stream message that is not a
sample event, and a measurement from a server that is not registered in
``hops_nodes`` or of another GPU type than its server's, is left out (see
:class:`Feed`), so the profiler's refusals change no estimate.

Each replica also follows the job events of stream ``HOPS_JOBS``: a job that
finished, failed or was cancelled leaves the database, and measurements of it
that arrive later are left out (:class:`Endings`), but for a profile's part
in its signature's shared profile, which does not depend on whether the
job's end came first (:func:`apply_sample_event`). Otherwise a long-running
replica would keep every job's sample history for ever (up to 4,096 data and
wait samples per job and GPU type), although nothing asks for its estimate
again. Only the ended jobs' ids are kept.

The stream also carries ``profile_stale`` (``hops.v1.signatures.stale``),
applied in the same order: it marks a signature's shared profiles stale.
A replica publishes one itself when a job's first sample disagrees with
the estimate a shared profile gave it, and answers ``list_signatures``
(:mod:`services.estimator.signatures`).

Settings: the runtime's (:mod:`services.runtime.settings`) only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeAlias, assert_never

import msgspec
from nats.aio.msg import Msg
from nats.js.errors import InvalidKeyError, KeyNotFoundError
from nats.js.kv import KeyValue

from estimation.database import ThroughputDatabase
from estimation.estimator import estimate_job
from services.estimator.signatures import (
    Served,
    apply_stale,
    listing,
    stale_msg_id,
    stale_of_sample,
)
from services.runtime.bus import publish_event, serve_requests
from services.runtime.follow import follow_stream
from services.runtime.service import ServiceContext
from shared import events as ev
from shared import subjects
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId, ServerId
from shared.records import NodeRecord
from shared.reuse import profile_signature

Measurement: TypeAlias = ev.SampleReported | ev.ProfileReported


def apply_sample_event(db: ThroughputDatabase, event: Measurement, ended: bool = False) -> None:
    """Feed one measurement of the stream to the database; ``ended``: its
    job has ended here, so it gets no record of its own, but a profile of it
    still serves its signature (a shared profile). Whether a job's end is
    applied before or after its profile depends on how the two streams
    interleave (``HOPS_JOBS`` and ``HOPS_SAMPLES``: a replica replaying them
    after a restart usually has the end first), and must not decide which
    shared profiles a replica has: a job that ran on one, with no profile of
    its own, would otherwise get no estimate after a restart and wait for
    ever."""
    if isinstance(event, ev.ProfileReported):
        if ended:
            db.share_profile(event.report)
        else:
            db.record_profile(event.report)
    elif not ended:
        db.record_sample(event.sample)


def estimates_for(
    db: ThroughputDatabase, req: ev.EstimateRequest
) -> tuple[ev.EstimateReply, dict[JobId, str]]:
    """One estimate per requested job that has a profile (its own or its
    signature's shared one) on a type of the request's cluster, why the
    others that have a profile got none, and the types each job's signature
    holds a current shared profile of."""
    out: dict[JobId, JobEstimate] = {}
    failed: dict[JobId, str] = {}
    shared: dict[JobId, tuple[GpuType, ...]] = {}
    for spec in req.jobs:
        types = db.shared_types(profile_signature(spec))
        if types:
            shared[spec.id] = tuple(sorted(types))
        if not db.profiled_types(spec.id) and not types:
            continue
        try:
            est = estimate_job(db, spec, req.cluster)
        except (ValueError, LookupError, ArithmeticError) as e:
            failed[spec.id] = f"{type(e).__name__}: {e}"
            continue
        if est.by_type:
            out[spec.id] = est
    return ev.EstimateReply(estimates=out, shared=shared), failed


FINAL_EVENTS = (ev.JobFinished, ev.JobFailed, ev.JobCancelled)


def forget_ended(db: ThroughputDatabase, ended: set[JobId], event: ev.JobEvent) -> bool:
    """Drop the records of a job that reached a final state and remember it
    as ended; true when the event ended the job here."""
    if not isinstance(event, FINAL_EVENTS) or event.job_id in ended:
        return False
    ended.add(event.job_id)
    db.forget(event.job_id)
    return True


def measured_job(event: Measurement) -> JobId:
    return event.report.job_id if isinstance(event, ev.ProfileReported) else event.sample.job_id


def measured_on(event: Measurement) -> tuple[ServerId, GpuType]:
    """The server and GPU type a report or sample was measured on."""
    if isinstance(event, ev.ProfileReported):
        return event.report.server_id, event.report.gpu_type
    return event.sample.server_id, event.sample.gpu_type


def unusable(event: Measurement, server_type: GpuType | None) -> tuple[str, str] | None:
    """Why a measurement must not enter the database, as ``(code, message)``
    (``server_type``: the registered type of its server, ``None`` when it is
    not registered)."""
    server, gpu_type = measured_on(event)
    if server_type is None:
        return "unknown_server", f"measured on {server}, which is not a registered server"
    if server_type != gpu_type:
        message = f"measured on {server} as {gpu_type}, but the server's GPU type is {server_type}"
        return "type_mismatch", message
    return None


async def follow(
    ctx: ServiceContext,
    stream: subjects.StreamDef,
    on_msg: Callable[[Msg], Awaitable[None]],
    next_seq: Callable[[], int],
) -> None:
    """Follow ``stream`` in order from ``next_seq()`` in a task of the
    service (:func:`~services.runtime.follow.follow_stream`); returns once
    the consumer exists."""
    subscribed = asyncio.Event()
    ctx.spawn(
        follow_stream(
            ctx.nc,
            ctx.js,
            stream.name,
            stream.subjects,
            on_msg,
            next_seq,
            ctx.stopping,
            ctx.log,
            subscribed,
        ),
        stream.name,
    )
    await subscribed.wait()


class NodeTypes:
    """Registered servers' GPU types from ``hops_nodes`` (nodes are marked
    dead, never removed, so the answer for a past measurement stays the same)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.types: dict[str, GpuType] = {}

    async def type_of(self, server_id: str) -> GpuType | None:
        known = self.types.get(server_id)
        if known is not None:
            return known
        try:
            entry = await self.kv.get(server_id)
            node = msgspec.json.decode(entry.value or b"", type=NodeRecord)
        except (KeyNotFoundError, InvalidKeyError, msgspec.DecodeError):
            return None  # not cached: it may register later
        self.types[server_id] = node.server.gpu_type
        return node.server.gpu_type


class Feed:
    """The ordered consumer over ``HOPS_SAMPLES`` and the catch-up state.

    A measurement from a server that is not registered, or of another GPU
    type than its server's, is left out (the profiler reports refused
    profiles; refused samples are reported here). Problems met while
    catching up were reported when they were new, so they are only logged.
    """

    def __init__(
        self, ctx: ServiceContext, db: ThroughputDatabase, nodes: NodeTypes, endings: Endings
    ) -> None:
        self.ctx = ctx
        self.db = db
        self.nodes = nodes
        self.ended = endings.ended
        self.served = endings.served
        self.last_seq = 0
        self.target = 0
        self.caught_up = asyncio.Event()
        self.applied = 0

    async def start(self) -> None:
        info = await self.ctx.js.stream_info(subjects.STREAM_SAMPLES.name)
        self.target = info.state.last_seq if info.state.messages else 0
        if self.target == 0:
            self.caught_up.set()
        # Followed again from the next sequence after a NATS restart, which
        # ends the (ephemeral) ordered consumer.
        await follow(self.ctx, subjects.STREAM_SAMPLES, self.on_msg, lambda: self.last_seq + 1)

    async def on_msg(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.last_seq:  # a redelivery after the consumer was reset
            return
        self.last_seq = seq
        try:
            match ev.decode_sample_event(msg.data):
                case ev.ProfileStale() as stale:
                    self._stale(stale)
                case ev.SampleReported() | ev.ProfileReported() as event:
                    await self._measurement(msg, event)
                case other:
                    assert_never(other)
        except ev.WireError as e:
            await self._reject(msg, str(e), e.code, True)
        except ValueError as e:  # a report the database cannot use
            await self._reject(msg, f"rejected: {e}", ev.INVALID, True)
        if not self.caught_up.is_set() and seq >= self.target:
            self.caught_up.set()

    async def _measurement(self, msg: Msg, event: Measurement) -> None:
        job_id = measured_job(event)
        problem = unusable(event, await self.nodes.type_of(measured_on(event)[0]))
        ended = job_id in self.ended
        if ended:  # a late report: at most a profile's shared part is kept
            self.ctx.log.debug("measurement of an ended job", job_id=job_id)
        if problem is not None:
            if not ended:
                live = isinstance(event, ev.SampleReported)
                await self._reject(msg, problem[1], problem[0], live)
            return
        if not ended and isinstance(event, ev.SampleReported):
            await self._check_reuse(event)
        apply_sample_event(self.db, event, ended)
        if not ended:
            self.applied += 1

    async def _check_reuse(self, event: ev.SampleReported) -> None:
        """Publish ``profile_stale`` when a job's first sample disagrees with
        the estimate its signature's shared profile gave (the simulator's rule)."""
        stale = stale_of_sample(self.db, self.served, event.sample, time.time())
        if stale is None or not self.caught_up.is_set():
            return
        self.ctx.log.info("shared profile disagrees with a job's samples", job_id=stale.job_id,
                          signature=stale.signature, gpu_type=stale.gpu_types[0],
                          estimated=round(stale.estimated, 3), measured=round(stale.measured, 3))
        await publish_event(self.ctx.js, subjects.SIGNATURES_STALE, stale,
                            msg_id=stale_msg_id(stale))

    def _stale(self, event: ev.ProfileStale) -> None:
        marked = apply_stale(self.db, event)
        self.ctx.log.info("shared profiles stale", signature=event.signature, reason=event.reason,
                          gpu_types=list(marked), job_id=event.job_id or None,
                          estimated=round(event.estimated, 3), measured=round(event.measured, 3))

    async def _reject(self, msg: Msg, error: str, code: str, report: bool) -> None:
        if report and self.caught_up.is_set():
            await self.ctx.reporter.report(msg.subject, error, code, msg.data)
        else:
            self.ctx.log.warning("measurement left out", subject=msg.subject, error=error)


class Endings:
    """The ordered consumer over ``HOPS_JOBS`` that removes ended jobs from
    the database (see the module docstring). Job events are the scheduler's
    and the monitor's to check; one this service cannot decode is skipped."""

    def __init__(self, ctx: ServiceContext, db: ThroughputDatabase) -> None:
        self.ctx = ctx
        self.db = db
        self.ended: set[JobId] = set()
        self.served = Served()
        self.last_seq = 0

    async def start(self) -> None:
        await follow(self.ctx, subjects.STREAM_JOBS, self.on_msg, lambda: self.last_seq + 1)

    async def on_msg(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self.last_seq:
            return
        self.last_seq = seq
        try:
            event = ev.decode_job_event(msg.data)
        except ev.WireError:
            return
        if forget_ended(self.db, self.ended, event):
            self.served.forget(event.job_id)
            self.ctx.log.debug("ended job forgotten", job_id=event.job_id)


async def run(ctx: ServiceContext) -> None:
    """The service's main: catch up with the stream, then answer requests."""
    # Shared profiles are offered to every job; the leader decides, by its
    # policy's ``profile_reuse``, whether a job skips profiling for them.
    db = ThroughputDatabase(reuse=True)
    endings = Endings(ctx, db)
    await endings.start()
    feed = Feed(ctx, db, NodeTypes(await ctx.js.key_value(subjects.KV_NODES)), endings)
    await feed.start()
    ctx.log.info("catching up", stream_last_seq=feed.target)
    waiter = asyncio.create_task(feed.caught_up.wait())
    stopping = asyncio.create_task(ctx.stopping.wait())
    await asyncio.wait((waiter, stopping), return_when=asyncio.FIRST_COMPLETED)
    for task in (waiter, stopping):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if ctx.stopping.is_set():
        return

    async def handle(req: ev.EstimateRequest) -> ev.Message:
        reply, failed = estimates_for(db, req)
        endings.served.remember(req, reply)
        for job_id, error in failed.items():
            ctx.log.warning("cannot estimate", job_id=job_id, error=error)
        ctx.log.debug("estimated", jobs=len(req.jobs), answered=len(reply.estimates))
        return reply

    await serve_requests(
        ctx.nc,
        subjects.ESTIMATE,
        ev.decode_estimate_request,
        handle,
        ctx.reporter,
        queue=subjects.ESTIMATOR_QUEUE,
        on_error=lambda code, error: ev.EstimateReply(ok=False, code=code, error=error),
    )
    await serve_requests(
        ctx.nc,
        subjects.SIGNATURES_LIST,
        ev.decode_list_signatures,
        lambda _req: _listing(db),
        ctx.reporter,
        queue=subjects.ESTIMATOR_QUEUE,
        on_error=lambda code, error: ev.SignaturesReply(ok=False, code=code, error=error),
    )
    ctx.log.info("serving estimates", applied=feed.applied, jobs=len(db.jobs()))


async def _listing(db: ThroughputDatabase) -> ev.Message:
    return listing(db)
