"""The dashboard's live feed: one set of KV watches per gateway, fanned out
to each open page (server-sent events), filtered per principal; and a
bounded ring of cluster samples (GPUs in use, jobs waiting) for the plots.

One watcher serves every page, so that a page costs the gateway a queue,
not a NATS consumer, and a tenant's page never receives another tenant's
job: :func:`visible` decides before anything is queued for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.js.kv import KeyValue

from gateway.bus import GatewayBus, is_job_key
from shared import subjects
from shared.jobkeys import local_id, split_key
from shared.records import JobRecord
from shared.tenants import DEFAULT_TENANT, Principal

_JOB = msgspec.json.Decoder(JobRecord, strict=False)
# Phases that count as waiting in the queue-length plot.
WAITING = frozenset({"submitted", "profiling", "queued"})
# A page that reads slower than this many events is sent a "reload" instead.
QUEUE_BOUND = 256
# How long the gateway's shutdown waits for the watches to stop.
STOP_S = 2.0


@dataclass(frozen=True)
class Sample:
    """One point of the plots: when, GPUs in use and alive, jobs waiting."""

    at: float
    used: int
    gpus: int
    waiting: int


@dataclass(eq=False)  # each open page is its own (hashed by identity)
class Page:
    """One open page's event queue and whom it shows."""

    principal: Principal
    queue: asyncio.Queue[dict[str, Any]] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_BOUND))


def tenant_of(key: str) -> str:
    """The tenant of a job key (a bare key is the default tenant's)."""
    return split_key(key)[0] or DEFAULT_TENANT


def visible(principal: Principal, event: dict[str, Any]) -> dict[str, Any] | None:
    """``event`` as ``principal`` may see it: a job event only of its own
    job, named by its id; cluster events to everyone (they carry no job)."""
    if event["kind"] not in ("job", "explain"):
        return event
    if principal.admin or principal.tenant is None:
        return event
    if event["tenant"] != principal.tenant:
        return None
    return {**event, "id": local_id(event["id"])}


class Hub:
    """The watches, the pages and the sample ring of one gateway."""

    def __init__(self, bus: GatewayBus, sample_s: float, keep: int) -> None:
        self.bus = bus
        self.sample_s = sample_s
        self.samples: deque[Sample] = deque(maxlen=keep)
        self.phases: dict[str, str] = {}
        self.pages: set[Page] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(c, context=contextvars.Context()) for c in (
            self._watch_jobs(), self._watch_changes(subjects.KV_EXPLAIN, "explain"),
            self._watch_changes(subjects.KV_NODES, "cluster"),
            self._watch_changes(subjects.KV_ALLOC, "cluster"), self._sample())]

    async def stop(self) -> None:
        """Cancel the watches and the sampler, again while one still runs: a
        single cancellation was seen lost after the app had served a request
        (the tasks kept waiting), so it is repeated; bounded, so that nothing
        holds the gateway's shutdown."""
        deadline = time.monotonic() + STOP_S
        pending = {t for t in self._tasks if not t.done()}
        while pending and time.monotonic() < deadline:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        if pending:
            self.bus.log.warning("dashboard watches still stopping", tasks=len(pending))

    def open(self, principal: Principal) -> Page:
        page = Page(principal)
        self.pages.add(page)
        return page

    def close(self, page: Page) -> None:
        self.pages.discard(page)

    def publish(self, event: dict[str, Any]) -> None:
        for page in list(self.pages):
            shown = visible(page.principal, event)
            if shown is None:
                continue
            try:
                page.queue.put_nowait(shown)
            except asyncio.QueueFull:  # a page that falls behind reloads instead
                with contextlib.suppress(asyncio.QueueEmpty):
                    while True:
                        page.queue.get_nowait()
                page.queue.put_nowait({"kind": "reload"})

    async def _watcher(self, bucket: str, keys_only: bool = False) -> Any:
        """A watch of ``bucket``; ``keys_only``: without the values (the
        server sends none), for buckets whose changes a page reads itself."""
        kv: KeyValue = await self.bus.bucket(bucket)
        return await kv.watchall(meta_only=keys_only)

    async def _forever(self, what: str, watch: Any) -> None:
        """Run ``watch()`` again after a failure (NATS reconnecting), logged."""
        while True:
            try:
                await watch()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.bus.log.warning("dashboard watch failed", watch=what, error=repr(e))
                await asyncio.sleep(1.0)

    async def _watch_jobs(self) -> None:
        async def watch() -> None:
            watcher = await self._watcher(subjects.KV_JOBS)
            try:
                async for entry in watcher:
                    if entry is None or not entry.value:
                        continue
                    with contextlib.suppress(msgspec.DecodeError, ValueError):
                        self._job_changed(entry.key, _JOB.decode(entry.value))
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()

        await self._forever(subjects.KV_JOBS, watch)

    def _job_changed(self, key: str, record: JobRecord) -> None:
        before = self.phases.get(key)
        self.phases[key] = record.phase
        if before != record.phase:
            self.publish({"kind": "job", "id": key, "tenant": record.spec.tenant,
                          "phase": record.phase, "new": before is None})

    async def _watch_changes(self, bucket: str, kind: str) -> None:
        """Every update of ``bucket`` after the current values, as a ``kind`` event."""
        async def watch() -> None:
            watcher = await self._watcher(bucket, keys_only=True)
            current = True
            try:
                async for entry in watcher:
                    if entry is None:
                        current = False
                        continue
                    if current or (kind == "explain" and not is_job_key(entry.key)):
                        continue
                    event: dict[str, Any] = {"kind": kind}
                    if kind == "explain":
                        event.update(id=entry.key, tenant=tenant_of(entry.key))
                    self.publish(event)
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()

        await self._forever(bucket, watch)

    async def _sample(self) -> None:
        while True:
            try:
                view_nodes = await self.bus.nodes()
                placements = await self.bus.placements()
                alive = [n for n in view_nodes if n.alive]
                used = {(sid, i) for p in placements for sid, ix in p.gpu_indices.items()
                        for i in ix}
                self.samples.append(Sample(
                    at=time.time(), used=len(used), gpus=sum(n.server.gpus for n in alive),
                    waiting=sum(1 for p in self.phases.values() if p in WAITING)))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.bus.log.warning("dashboard sample failed", error=repr(e))
            await asyncio.sleep(self.sample_s)
