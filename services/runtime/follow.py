"""Following a stream with an ordered consumer that outlives a NATS restart.

An ordered consumer is ephemeral and kept in the server's memory: when the
server restarts, it is gone, and nats-py notices only after two missed idle
heartbeats (10 s by default) before it creates a new one. For a reader that
must see every message soon (an estimator replica learns profiles this
way), :func:`follow_stream` creates the consumer again as soon as the
connection is back, from the sequence the reader asks for, so nothing is
skipped and, with a reader that ignores sequences it has seen, nothing is
applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from structlog.typing import FilteringBoundLogger

POLL_S = 0.25  # how often the connection's reconnect count is looked at


async def follow_stream(
    nc: NATS,
    js: JetStreamContext,
    stream: str,
    filter_subjects: Sequence[str],
    cb: Callable[[Msg], Awaitable[None]],
    next_seq: Callable[[], int],
    stopping: asyncio.Event,
    log: FilteringBoundLogger,
    subscribed: asyncio.Event | None = None,
) -> None:
    """Deliver ``stream`` (``filter_subjects``) to ``cb`` in order from
    ``next_seq()`` until ``stopping``; after every reconnect, again from
    ``next_seq()``. ``subscribed`` is set once the first consumer exists."""
    while not stopping.is_set():
        reconnects = nc.stats["reconnects"]
        start = max(1, next_seq())
        config = ConsumerConfig(filter_subjects=list(filter_subjects), opt_start_seq=start)
        try:
            sub = await js.subscribe(
                "",
                stream=stream,
                cb=cb,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                config=config,
            )
        except (nats.errors.Error, TimeoutError) as e:  # JetStream not back yet
            log.warning("cannot follow the stream yet", stream=stream, error=repr(e))
            await _pause(stopping, 0.5)
            continue
        if subscribed is not None:
            subscribed.set()
        try:
            while not stopping.is_set() and nc.stats["reconnects"] == reconnects:
                await _pause(stopping, POLL_S)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if not stopping.is_set():
            log.info("reconnected: following the stream again", stream=stream, from_seq=next_seq())


async def _pause(stopping: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
