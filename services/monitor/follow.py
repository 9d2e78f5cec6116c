"""What the monitor follows of the other services' state: the KV buckets
the scheduler and the placer write, and the scheduler's queue view."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import msgspec
import nats.errors
from nats.js.kv import KeyValue

from services.monitor.metrics import LatencyBook
from services.runtime.service import ServiceContext
from shared import subjects
from shared.records import QueueView


async def watch_bucket(ctx: ServiceContext, bucket: str,
                       on_entry: Callable[[KeyValue.Entry], None],
                       synced: asyncio.Event) -> None:
    """Follow every key of ``bucket``; ``synced`` is set once the current
    values were replayed. A watcher does not outlive a restart of the NATS
    server, so after each reconnect a new one replays the latest value (or
    delete marker) of every key; the handlers are idempotent."""
    nc = ctx.nc
    while not ctx.stopping.is_set():
        reconnects = nc.stats["reconnects"]
        try:
            watcher = await (await ctx.js.key_value(bucket)).watchall()
        except nats.errors.Error as e:
            ctx.log.warning("cannot watch", bucket=bucket, error=repr(e))
            await asyncio.sleep(1.0)
            continue
        try:
            while nc.stats["reconnects"] == reconnects:
                try:
                    entry = await watcher.updates(timeout=1.0)  # type: ignore[no-untyped-call]
                except nats.errors.TimeoutError:
                    continue
                if entry is None:
                    synced.set()
                else:
                    on_entry(entry)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]


async def poll_queue(ctx: ServiceContext, book: LatencyBook, period: float) -> None:
    """Feed the latency ratios of the scheduler's queue view to ``book``."""
    decoder = msgspec.json.Decoder(QueueView)
    while not ctx.stopping.is_set():
        try:
            reply = await ctx.nc.request(subjects.QUEUE, b"", timeout=2.0)
            view = decoder.decode(reply.data)
            if view.ok:
                book.observe(view.entries)
        except (nats.errors.Error, msgspec.DecodeError) as e:
            ctx.log.debug("no queue view", error=repr(e))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), period)
