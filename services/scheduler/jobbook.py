"""The scheduler leader's job records (Hops §3.1): KV ``hops_jobs`` and the
leader's copy of it, with each key's revision.

The leader is the only writer of job records (:mod:`scheduling.live.state`).
A :class:`JobBook` loads them, applies each job event of ``HOPS_JOBS`` to
its record (a write conflict reloads the record and applies the event once
more), applies the leader's own changes (:meth:`JobBook.update`) and
republishes each event on its tenant's live feed,
``hops.v1.tenants.<tenant>.events.<job_id>`` (:mod:`scheduling.live.tenancy`),
telling :attr:`JobBook.on_applied` (the job's timeline, :mod:`.explainer`).
Every write holds :attr:`JobBook.lock` until the copy follows it, so a
reader under the lock (the queue view) sees every record a client could
have read back already.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from structlog.typing import FilteringBoundLogger

from scheduling.live import state as st
from scheduling.live import tenancy as tn
from scheduling.live.state import LiveJobRecord
from services.runtime.consumer import Delivery
from services.runtime.service import ServiceContext
from services.scheduler.kv import get_record, read_bucket
from shared import events as ev
from shared import subjects
from shared.ids import JobId

Change = Callable[[LiveJobRecord], LiveJobRecord | None]
Applied = Callable[[LiveJobRecord, ev.JobEvent, bool], Awaitable[None]]


class JobBook:
    """The job records and their revisions; the only writer of ``hops_jobs``."""

    def __init__(self, ctx: ServiceContext, log: FilteringBoundLogger) -> None:
        self.ctx = ctx
        self.log = log
        self.records: dict[JobId, tuple[LiveJobRecord, int]] = {}
        self.lock = asyncio.Lock()
        self.kv_jobs: KeyValue | None = None  # set by open
        # told of each event of a known job, and whether it goes on the feed
        # (the job's timeline: told again on a redelivery, which the
        # timeline's message ids store once)
        self.on_applied: Applied | None = None

    async def open(self, js: JetStreamContext) -> None:
        self.kv_jobs = await js.key_value(subjects.KV_JOBS)

    def _kv(self) -> KeyValue:
        assert self.kv_jobs is not None, "JobBook.open first"
        return self.kv_jobs

    async def load(self) -> None:
        """Every record of ``hops_jobs``; one that does not decode is reported."""
        for key, (data, revision) in (await read_bucket(self.ctx.js, subjects.KV_JOBS)).items():
            try:
                self.records[JobId(key)] = (st.decode_record(data), revision)
            except msgspec.DecodeError as e:
                await self.ctx.reporter.report(f"kv {subjects.KV_JOBS}", f"{key}: {e}", ev.INVALID)

    def current(self) -> dict[JobId, LiveJobRecord]:
        """The records as they are now, without their revisions."""
        return {k: r for k, (r, _) in self.records.items()}

    async def apply(
        self, event: ev.JobEvent, delivery: Delivery, facts: Callable[[JobId], st.Facts]
    ) -> bool:
        """Apply ``event`` to its job's record (:func:`scheduling.live.state.apply_event`,
        with the leader's ``facts`` about the job) and republish it on the
        tenant's feed; whether it asks for a plan (:func:`scheduling.live.state.wants_plan`)."""
        job_id, tag = event.job_id, event.__struct_config__.tag
        async with self.lock:
            for attempt in (1, 2):  # a conflict reloads the record: apply once more
                rec, revision = self.records.get(job_id) or await get_record(self._kv(), job_id)
                if rec is not None:  # e.g. created by admission: the leader knows it now
                    self.records[job_id] = (rec, revision)
                applied = st.apply_event(rec, event, delivery.stream_seq, facts(job_id))
                if applied.record is None:
                    break
                try:
                    await self._store(job_id, applied.record, revision)
                    break
                except KeyWrongLastSequenceError:
                    if attempt == 2:
                        raise
        await self._feed(applied.record or rec, event, delivery, applied.record is not None)
        if applied.note == "unknown job":
            error = f"{tag} for unknown job {job_id}"
            await self.ctx.reporter.report(delivery.subject, error, "not_found")
        elif (current := applied.record or rec) is not None:
            phase, note = current.phase, applied.note
            self.log.info("job event applied", kind=tag, phase=phase, note=note)
        return st.wants_plan(rec, applied.record, event)

    async def _feed(
        self, rec: LiveJobRecord | None, event: ev.JobEvent, delivery: Delivery, changed: bool
    ) -> None:
        """Republish ``event`` on its tenant's live feed: the leader applies
        every event, and each once (:func:`scheduling.live.tenancy.feed_subject`)."""
        subject = tn.feed_subject(rec, event, delivery.num_delivered == 1, changed)
        if subject is not None:
            try:
                await self.ctx.nc.publish(subject, ev.encode(tn.feed_event(event)))
            except Exception as e:  # the feed is a convenience: never fail the event for it
                self.log.warning("tenant feed publish failed", subject=subject, error=repr(e))
        # the event first, then its explanation: a feed reads in that order
        if rec is not None and self.on_applied is not None:
            await self.on_applied(rec, event, subject is not None)

    async def _store(self, job_id: JobId, rec: LiveJobRecord, revision: int) -> None:
        """Write ``rec`` if the key is still at ``revision``; on a conflict
        reload it and raise (the event is redelivered and applied again)."""
        kv, data = self._kv(), st.encode_record(rec)
        try:
            if revision:
                new_revision = await kv.update(job_id, data, last=revision)
            else:
                new_revision = await kv.create(job_id, data)
        except KeyWrongLastSequenceError:
            fresh, fresh_revision = await get_record(kv, job_id)
            if fresh is not None:
                self.records[job_id] = (fresh, fresh_revision)
            raise
        self.records[job_id] = (rec, new_revision)

    async def update(self, job_id: JobId, change: Change) -> bool:
        """Apply a change of the leader's own (not from an event); False when none."""
        async with self.lock:
            rec, revision = self.records[job_id]
            new = change(rec)
            if new is None:
                return False
            with contextlib.suppress(KeyWrongLastSequenceError):
                await self._store(job_id, new, revision)
                return True
        return False
