"""The gateway's side of NATS: requests to the scheduler and reads of the KV
buckets. A thin shell: the payloads and records are those of
:mod:`shared.events` and :mod:`shared.records`; decisions are in
:mod:`gateway.views`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from scheduling.live.cells import TenantRecord
from services.runtime.bus import (
    ErrorReporter,
    JetStreamLayout,
    LayoutError,
    connect,
    ensure_jetstream,
)
from services.runtime.identity import GATEWAY
from services.runtime.kv import read_bucket
from services.runtime.settings import RuntimeSettings
from shared import subjects
from shared.events import (
    CancelJob,
    DrainNode,
    HoldJob,
    ReloadTenants,
    RemoveNode,
    Reply,
    TenantsReloaded,
    WireError,
    decode_reply,
    decode_tenants_reloaded,
    encode,
)
from shared.explain import JobExplain, TimelineEntry, reserved_key
from shared.ids import JobId, ServerId
from shared.records import JobRecord, NodeRecord, Placement, QueueView
from shared.subjects import SubjectError, check_token

T = TypeVar("T")

_JOB = msgspec.json.Decoder(JobRecord, strict=False)
_NODE = msgspec.json.Decoder(NodeRecord, strict=False)
_PLACEMENT = msgspec.json.Decoder(Placement, strict=False)
_QUEUE = msgspec.json.Decoder(QueueView, strict=False)
_EXPLAIN = msgspec.json.Decoder(JobExplain, strict=False)
_TIMELINE = msgspec.json.Decoder(TimelineEntry, strict=False)
_TENANT = msgspec.json.Decoder(TenantRecord, strict=False)
_BY_JOB = (subjects.KV_JOBS, subjects.KV_ALLOC, subjects.KV_EXPLAIN,
           subjects.STREAM_TIMELINE.name)
# hops.v1.queue takes no arguments; an empty JSON object leaves room for some.
QUEUE_REQUEST = b"{}"


def _tenant_record(data: bytes) -> dict[str, Any]:
    """A ``hops_tenants`` value, checked, as a JSON value."""
    value: dict[str, Any] = msgspec.to_builtins(_TENANT.decode(data))
    return value


class Unavailable(Exception):
    """No service answered a request (none running, or it timed out)."""


class BadUpstream(Exception):
    """A service answered with something that is not the expected message."""


def is_job_key(key: str) -> bool:
    """Whether a ``hops_explain`` key is a job's (not the forecast's state)."""
    return not reserved_key(key)


class GatewayBus:
    """One NATS connection and the three KV buckets the gateway reads."""

    def __init__(self, nc: NATS, timeout: float, reporter: ErrorReporter) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.timeout = timeout
        self.reporter = reporter
        self.log = reporter.log
        self._kv: dict[str, KeyValue] = {}

    @classmethod
    async def open(cls, settings: RuntimeSettings, timeout: float) -> GatewayBus:
        """Connect (waiting for NATS as long as it takes) and ensure the
        streams and buckets exist, as every service does at start."""
        nc = await connect(settings, "gateway")
        bus = cls(nc, timeout, ErrorReporter(nc, "gateway"))
        try:
            await ensure_jetstream(bus.js, JetStreamLayout.of(settings, GATEWAY))
        except LayoutError as e:  # the reason in words, before uvicorn says startup failed
            bus.log.error("gateway failed", code=e.code, reason=str(e))
            await nc.close()
            raise
        return bus

    async def close(self) -> None:
        try:
            await self.nc.drain()
        except Exception:  # a connection that cannot drain is closed anyway
            try:
                await self.nc.close()
            except Exception as e:  # lost already (NATS down): nothing left to close
                self.log.warning("nats connection lost at shutdown", error=repr(e))

    async def _request(self, subject: str, data: bytes) -> bytes:
        try:
            msg = await self.nc.request(subject, data, timeout=self.timeout)
        except nats.errors.NoRespondersError:
            raise Unavailable(f"no service answers {subject}: is the scheduler running?") from None
        except nats.errors.TimeoutError:
            raise Unavailable(f"no reply on {subject} within {self.timeout:g} s") from None
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
            raise Unavailable("the gateway has lost its NATS connection") from None
        return msg.data

    async def _reply(self, subject: str, data: bytes) -> Reply:
        raw = await self._request(subject, data)
        try:
            return decode_reply(raw)
        except WireError as e:
            await self.reporter.report(subject, f"reply: {e}", e.code, raw)
            raise BadUpstream(f"bad reply on {subject}: {e}") from None

    async def submit(self, body: bytes) -> Reply:
        """Forward a submit body as it came: the scheduler validates it."""
        return await self._reply(subjects.JOBS_SUBMIT, body)

    async def cancel(self, job_id: str, reason: str) -> Reply:
        """Ask the scheduler to cancel ``job_id`` (a valid subject token)."""
        data = encode(CancelJob(job_id=JobId(job_id), reason=reason))
        return await self._reply(subjects.JOBS_CANCEL, data)

    async def hold(self, job_id: str, hold: bool, reason: str) -> Reply:
        """Ask the scheduler to hold (or release) ``job_id`` (a valid subject token)."""
        data = encode(HoldJob(job_id=JobId(job_id), hold=hold, reason=reason))
        return await self._reply(subjects.JOBS_HOLD, data)

    async def remove_node(self, server_id: str, force: bool, reason: str) -> Reply:
        """Ask the monitor to remove node ``server_id`` (a valid subject token)."""
        data = encode(RemoveNode(server_id=ServerId(server_id), force=force, reason=reason))
        return await self._reply(subjects.NODES_REMOVE, data)

    async def drain_node(self, server_id: str, drain: bool, move: bool, reason: str) -> Reply:
        """Ask the monitor to drain (``move``: and move its jobs) or undrain
        node ``server_id`` (a valid subject token)."""
        data = encode(DrainNode(server_id=ServerId(server_id), drain=drain, move=move,
                                reason=reason))
        return await self._reply(subjects.NODES_DRAIN, data)

    async def reload_tenants(self, wait_s: float = 1.0) -> list[TenantsReloaded]:
        """Ask every scheduler replica to reload the tenants file; each one's
        answer that comes within ``wait_s`` (no queue group: all answer)."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        answers: list[TenantsReloaded] = []
        try:
            await self.nc.publish(subjects.TENANTS_RELOAD, encode(ReloadTenants()), reply=inbox)
            deadline = time.monotonic() + wait_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except nats.errors.TimeoutError:
                    break
                with contextlib.suppress(WireError):
                    answers.append(decode_tenants_reloaded(msg.data))
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return answers

    async def request(self, subject: str, data: bytes) -> bytes:
        """A request's raw reply; :class:`Unavailable` when nothing answers."""
        return await self._request(subject, data)

    async def queue(self) -> QueueView:
        raw = await self._request(subjects.QUEUE, QUEUE_REQUEST)
        try:
            return _QUEUE.decode(raw)
        except msgspec.DecodeError as e:
            await self.reporter.report(subjects.QUEUE, f"reply: {e}", "invalid", raw)
            raise BadUpstream(f"bad reply on {subjects.QUEUE}: {e}") from None

    async def bucket(self, name: str) -> KeyValue:
        if name not in self._kv:
            self._kv[name] = await self.js.key_value(name)
        return self._kv[name]

    async def job(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id``, or None when there is none."""
        return await self._get(subjects.KV_JOBS, job_id, _JOB.decode)

    async def explain(self, job_id: str) -> JobExplain | None:
        """The leader's ``hops_explain`` entry of ``job_id`` (None: none yet)."""
        return await self._get(subjects.KV_EXPLAIN, job_id, _EXPLAIN.decode)

    async def explains(self) -> dict[str, JobExplain]:
        """Every ``hops_explain`` entry, by job key."""
        values = await self._values(subjects.KV_EXPLAIN, _EXPLAIN.decode, keep=is_job_key)
        return {e.job_id: e for e in values}

    async def timeline(self, job_id: str, limit: int) -> tuple[list[TimelineEntry], bool]:
        """The first ``limit`` entries of ``job_id``'s timeline (stream
        ``HOPS_TIMELINE``, its subject), oldest first, and whether more
        follow. Read message by message (``next_by_subj``): requests on the
        JetStream API alone, which every service may use, and bounded by
        the stream's limit per job."""
        subject = subjects.timeline(job_id)
        entries: list[TimelineEntry] = []
        seq = 1
        while True:
            try:
                msg = await self.js.get_msg(subjects.STREAM_TIMELINE.name, seq=seq,
                                            subject=subject, next=True)
            except NotFoundError:
                return entries, False
            if len(entries) == limit:
                return entries, True
            seq = (msg.seq or seq) + 1
            entry = self._decode(_TIMELINE.decode, subjects.STREAM_TIMELINE.name, job_id,
                                 msg.data or b"")
            if entry is not None:
                entries.append(entry)

    async def _get(self, bucket: str, key: str, decode: Callable[[bytes], T]) -> T | None:
        """The value of ``key`` in ``bucket`` (a job key), None when there is none."""
        try:
            check_token(key, "job id")
        except SubjectError:
            return None
        kv = await self.bucket(bucket)
        try:
            entry = await kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        if entry.value is None:
            return None
        return self._decode(decode, bucket, key, entry.value)

    async def jobs(self) -> list[JobRecord]:
        return await self._values(subjects.KV_JOBS, _JOB.decode)

    async def nodes(self) -> list[NodeRecord]:
        return await self._values(subjects.KV_NODES, _NODE.decode)

    async def placements(self) -> list[Placement]:
        return await self._values(subjects.KV_ALLOC, _PLACEMENT.decode)

    async def tenant_records(self) -> list[dict[str, Any]]:
        """The tenants' views the leader wrote (``hops_tenants``), as JSON values."""
        return await self._values(subjects.KV_TENANTS, _tenant_record)

    async def _values(self, bucket: str, decode: Callable[[bytes], T],
                      keep: Callable[[str], bool] = lambda _: True) -> list[T]:
        """Every current value of ``bucket`` whose key ``keep`` accepts, read
        in one pass (:func:`services.runtime.kv.read_bucket`); a value that
        does not decode is reported and left out."""
        await self.bucket(bucket)  # created if missing, as before
        out: list[T] = []
        for key, entry in (await read_bucket(self.js, bucket)).items():
            if entry.data and keep(key):
                value = self._decode(decode, bucket, key, entry.data)
                if value is not None:
                    out.append(value)
        return out

    def _decode(self, decode: Callable[[bytes], T], bucket: str, key: str, data: bytes) -> T | None:
        try:
            return decode(data)
        except (msgspec.DecodeError, ValueError) as e:
            # keys of hops_jobs, hops_alloc and hops_explain are job ids, as are
            # the timeline's (its stream's name stands for the bucket)
            ids = {"job_id": key} if bucket in _BY_JOB else {}
            self.log.warning("undecodable record", bucket=bucket, key=key, error=str(e), **ids)
            return None
