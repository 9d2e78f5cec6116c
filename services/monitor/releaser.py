"""The imperative side of a release (the decisions are
:mod:`services.monitor.release`): under a per-job lock, read the job's
``hops_alloc`` entry, decide, stop what still runs, delete or shrink the
entry with a compare-and-set on its revision, then publish the job event
and ``resources_released``.

Every publish carries a msg_id derived from the entry's revision (and
``<job>:job_failed`` for a failure, shared with the executor), so a release
repeated after a crash or by two paths is recorded once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from services.monitor.release import Release, confirmed
from services.runtime.bus import publish_event, request
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import (
    JobFailed,
    JobStopped,
    ResourcesReleased,
    StopJob,
    WireError,
    decode_ack,
)
from shared.ids import JobId, ServerId
from shared.records import Placement

Decide = Callable[[Placement], Release | None]
STOP_ATTEMPTS = 2


class Releaser:
    def __init__(self, ctx: ServiceContext, kv_alloc: KeyValue, command_timeout_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.ctx = ctx
        self.kv_alloc = kv_alloc
        self.command_timeout_s = command_timeout_s
        self.clock = clock
        self.log = ctx.log
        self._locks: dict[JobId, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def release(self, job: JobId, decide: Decide) -> Release | None:
        """Apply ``decide`` to the job's current placement, under its lock;
        the release decided, None when there was nothing to release."""
        lock = self._locks.setdefault(job, asyncio.Lock())
        async with lock:
            try:
                entry = await self.kv_alloc.get(job)
            except nats.js.errors.KeyNotFoundError:
                return None
            placement = msgspec.json.decode(entry.value or b"", type=Placement)
            rel = decide(placement)
            if rel is not None:
                await self._apply(rel, entry.revision or 0)
            return rel
        # The lock stays: a waiter may hold it already, and a new lock for the
        # same job would let two releases run at once.

    def spawn(self, job: JobId, decide: Decide) -> None:
        """:meth:`release` in the background; a failure is logged and reported."""

        async def run() -> None:
            await self.release(job, decide)

        self.background(run())

    def background(self, coro: Awaitable[object]) -> None:
        async def guarded() -> None:
            try:
                await coro
            except Exception as e:
                self.log.exception("release failed")
                await self.ctx.reporter.report("monitor.release", repr(e), "internal")

        task = asyncio.create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply(self, rel: Release, revision: int) -> None:
        log = self.log.bind(job_id=rel.job_id)
        found = await asyncio.gather(*(
            self.stop(rel.job_id, s, f"release:{rel.job_id}@{s}:{revision}", rel.reason)
            for s in rel.stop_on
        ))
        if confirmed(rel, any(found)) is not rel:
            log.warning("no executor was running the silent job; requeued, not failed",
                        servers=list(rel.stop_on))
            rel = confirmed(rel, any(found))
        try:
            if rel.remaining is None:
                await self.kv_alloc.delete(rel.job_id, last=revision)
            else:
                await self.kv_alloc.update(rel.job_id, msgspec.json.encode(rel.remaining),
                                           last=revision)
        except nats.js.errors.APIError as e:  # rewritten meanwhile: the newer one stands
            log.info("placement changed during the release; left as is", error=str(e))
            return
        await self._publish(rel, revision)
        log.info("resources released", servers=list(rel.servers), reason=rel.reason,
                 job_event=rel.event)

    async def _publish(self, rel: Release, revision: int) -> None:
        now = self.clock()
        js = self.ctx.js
        if rel.event == "failed":
            await publish_event(js, subjects.job_events(rel.job_id),
                                JobFailed(job_id=rel.job_id, at=now, reason=rel.reason),
                                msg_id=f"{rel.job_id}:job_failed")
        elif rel.event == "stopped":
            stopped = JobStopped(job_id=rel.job_id, at=now, reason=rel.reason,
                                 samples_done=rel.samples_done)
            await publish_event(js, subjects.job_events(rel.job_id), stopped,
                                msg_id=f"{rel.job_id}:job_stopped:{revision}")
        released = ResourcesReleased(job_id=rel.job_id, server_ids=rel.servers, at=now,
                                     reason=rel.reason)
        await publish_event(js, subjects.RELEASED, released,
                            msg_id=f"{rel.job_id}:released:{revision}:{','.join(rel.servers)}")

    async def stop(self, job: JobId, server: ServerId, key: str, reason: str) -> bool:
        """Best effort: a node that does not answer is lost, or soon will be.
        True when the executor was running the job and stopped it."""
        cmd = StopJob(key=key, job_id=job, reason=reason)
        for attempt in range(1, STOP_ATTEMPTS + 1):
            try:
                ack = await request(self.ctx.nc, subjects.exec_commands(server), cmd, decode_ack,
                                    timeout=self.command_timeout_s)
            except nats.errors.NoRespondersError:
                self.log.info("no executor to stop the job", job_id=job, server_id=server)
                return False
            except (nats.errors.TimeoutError, WireError) as e:
                self.log.info("stop not answered", job_id=job, server_id=server,
                              attempt=attempt, error=repr(e))
                continue
            if not ack.ok and ack.code != "not_found":
                self.log.warning("stop refused", job_id=job, server_id=server, code=ack.code,
                                 error=ack.error)
            return ack.ok
        return False

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
