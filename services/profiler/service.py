"""The profiler service: turns profile reports into ``job_profiled`` events (Hops §3.2).

The profiling run itself is not executed here: a plan's ``ProfilingTask``
names a job, a GPU type and a server; the placer starts it as a
``start_job`` with mode ``profile`` on that server's executor, which runs the
job for a few iterations on the GPU it was given and publishes the measured
time modules as ``profile_reported`` on ``hops.v1.profiles.<job_id>``
(stream ``HOPS_SAMPLES``, where the estimators read them too).

This service consumes those reports with the durable consumer ``profiler``,
checks each against ``hops_nodes`` and ``hops_jobs``
(:func:`~services.profiler.tracker.check_report`: unknown server, unknown GPU
type, server of another type, unknown job), and for a valid one publishes
``job_profiled`` with the *cumulative* list of the job's profiled types on
``hops.v1.jobs.events.<job_id>``. The ``Nats-Msg-Id`` is keyed by that list,
so a redelivered report publishes nothing new. A refused report gets an
``error_record`` and changes nothing. After a restart the tracker starts
from the job record's ``profiled`` list, and the scheduler takes the union
of every ``job_profiled``, so no type is ever forgotten; several replicas may
share the durable consumer for the same reason.

Settings: the runtime's (:mod:`services.runtime.settings`) only.
"""

from __future__ import annotations

import time

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from structlog.contextvars import bound_contextvars

from services.profiler.tracker import ProfileTracker, check_report, profiled_msg_id
from services.runtime.bus import publish_event
from services.runtime.consumer import ConsumerSpec, Delivery, consume
from services.runtime.kv import read_bucket
from services.runtime.service import ServiceContext
from shared import events as ev
from shared import subjects
from shared.ids import GpuType
from shared.measurements import ProfileReport
from shared.records import JobRecord, NodeRecord

PROFILES_CONSUMER = ConsumerSpec(
    subjects.STREAM_SAMPLES.name, "profiler", subjects.PROFILES_ALL, ack_wait=10.0
)


async def _get(kv: KeyValue, key: str) -> bytes | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return entry.value


async def _all(js: JetStreamContext, bucket: str) -> list[bytes]:
    return [v.data for v in (await read_bucket(js, bucket)).values()]


class Profiler:
    """The consumer's handler: check, track, publish."""

    def __init__(self, ctx: ServiceContext, jobs: KeyValue, nodes: KeyValue) -> None:
        self.ctx = ctx
        self.jobs = jobs
        self.nodes = nodes
        self.tracker = ProfileTracker()

    async def handle(self, event: ev.SampleEvent, delivery: Delivery) -> None:
        if not isinstance(event, ev.ProfileReported):
            error = "expected profile_reported on a profiles subject, got sample_reported"
            await self.ctx.reporter.report(delivery.subject, error, ev.INVALID)
            return
        with bound_contextvars(job_id=event.report.job_id):  # the runtime's lines too
            await self._handle(event.report, delivery)

    async def _handle(self, report: ProfileReport, delivery: Delivery) -> None:
        log = self.ctx.log.bind(server_id=report.server_id)
        server_type = await self._server_type(report.server_id)
        known = await self._known_types() if server_type != report.gpu_type else {server_type}
        record = await self._job(report.job_id)
        verdict = check_report(report, server_type, known, record.phase if record else None)
        if verdict.outcome == "reject":
            await self.ctx.reporter.report(delivery.subject, verdict.message, verdict.code)
            return
        if verdict.outcome == "ignore" or record is None:
            log.info("profile ignored", reason=verdict.message)
            return
        if not self.tracker.knows(report.job_id):
            self.tracker.seed(report.job_id, record.profiled)
        types = self.tracker.accept(report)
        profiled = ev.JobProfiled(job_id=report.job_id, gpu_types=types, at=time.time())
        ack = await publish_event(
            self.ctx.js,
            subjects.job_events(report.job_id),
            profiled,
            msg_id=profiled_msg_id(report.job_id, types),
        )
        log.info("job profiled", gpu_types=list(types), duplicate=ack.duplicate)

    async def _server_type(self, server_id: str) -> GpuType | None:
        data = await _get(self.nodes, server_id) if _key_ok(server_id) else None
        return None if data is None else self._node(data).server.gpu_type

    async def _known_types(self) -> set[GpuType]:
        nodes = await _all(self.ctx.js, subjects.KV_NODES)
        return {self._node(data).server.gpu_type for data in nodes}

    async def _job(self, job_id: str) -> JobRecord | None:
        data = await _get(self.jobs, job_id) if _key_ok(job_id) else None
        return None if data is None else msgspec.json.decode(data, type=JobRecord)

    @staticmethod
    def _node(data: bytes) -> NodeRecord:
        return msgspec.json.decode(data, type=NodeRecord)


def _key_ok(key: str) -> bool:
    """Whether ``key`` can be a KV key at all (an id that cannot is unknown)."""
    return bool(key) and all(c.isalnum() or c in "-_=/" for c in key) and key.isascii()


async def run(ctx: ServiceContext) -> None:
    """The service's main: run the durable consumer until stopped."""
    jobs = await ctx.js.key_value(subjects.KV_JOBS)
    nodes = await ctx.js.key_value(subjects.KV_NODES)
    profiler = Profiler(ctx, jobs, nodes)
    ctx.log.info("consuming profile reports", durable=PROFILES_CONSUMER.durable)
    await consume(
        ctx.js, PROFILES_CONSUMER, ev.decode_sample_event, profiler.handle, ctx.reporter,
        ctx.stopping,
    )
