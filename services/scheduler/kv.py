"""Reading the scheduler's KV buckets: job records with their revisions,
whole buckets decoded leniently (a bad entry is logged and skipped), and a
watch of the alive servers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from structlog.typing import FilteringBoundLogger

from scheduling.live import snapshot as snap
from scheduling.live import state as st
from scheduling.live.drain import drain_states
from scheduling.live.state import LiveJobRecord
from services.runtime.consumer import ConsumerSpec
from services.runtime.kv import read_bucket as kv_read
from shared.records import NodeRecord

T = TypeVar("T")


async def get_record(kv: KeyValue, job_id: str) -> tuple[LiveJobRecord | None, int]:
    """The job's record and revision, ``(None, 0)`` when there is none."""
    try:
        entry = await kv.get(job_id)
    except KeyNotFoundError:
        return None, 0
    return st.decode_record(entry.value or b""), entry.revision or 0


async def read_bucket(js: JetStreamContext, bucket: str) -> dict[str, tuple[bytes, int]]:
    """Every key's latest value and revision (:func:`services.runtime.kv.read_bucket`:
    nats-py's own watcher may end before the values arrived)."""
    return {k: (v.data, v.revision) for k, v in (await kv_read(js, bucket)).items()}


async def decode_all(
    js: JetStreamContext, bucket: str, kind: type[T], log: FilteringBoundLogger
) -> list[T]:
    """Every value of ``bucket`` that decodes as ``kind``."""
    out: list[T] = []
    for key, (data, _) in (await read_bucket(js, bucket)).items():
        try:
            out.append(msgspec.json.decode(data, type=kind))
        except msgspec.DecodeError as e:
            log.warning("bad KV entry", bucket=bucket, key=key, error=str(e))
    return out


async def watch_topology(
    kv: KeyValue,
    nc: NATS,
    nodes: dict[str, NodeRecord],
    on_change: Callable[[], None],
    log: FilteringBoundLogger,
) -> None:
    """Keep ``nodes`` (by server id, the records read so far) as ``hops_nodes``
    has them, every update applied in place: a reader has the nodes without
    reading the bucket (the task loop, each pass). Call ``on_change``
    whenever the alive servers change, or are drained or undrained
    (:func:`scheduling.live.snapshot.topology`,
    :func:`scheduling.live.drain.drain_states`: heartbeat times do not count)."""
    topology = snap.topology(nodes.values())
    drained = drain_states(nodes.values())
    while True:
        # A watcher is an ordered consumer, which a NATS restart ends
        # without a word: after each reconnect a new one replays every key.
        reconnects = nc.stats["reconnects"]
        try:
            watcher = await kv.watchall()
        except (nats.errors.Error, TimeoutError) as e:
            log.warning("cannot watch the nodes yet", error=repr(e))
            await asyncio.sleep(0.5)
            continue
        try:
            while nc.stats["reconnects"] == reconnects:
                with contextlib.suppress(nats.errors.TimeoutError):
                    entry = await watcher.updates(timeout=0.5)  # type: ignore[no-untyped-call]
                    if entry is not None:
                        deleted = entry.operation in ("DEL", "PURGE")
                        snap.node_update(nodes, entry.key, None if deleted else entry.value)
                if (snap.topology(nodes.values()), drain_states(nodes.values())) \
                        != (topology, drained):
                    topology = snap.topology(nodes.values())
                    drained = drain_states(nodes.values())
                    log.info("cluster changed", servers=len(topology), drained=len(drained))
                    on_change()
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]


async def unacked(js: JetStreamContext, spec: ConsumerSpec) -> int:
    """Deliveries of the durable consumer not acked yet (taken by a leader
    before this one); 0 before the consumer exists."""
    with contextlib.suppress(NotFoundError):
        info = await js.consumer_info(spec.stream, spec.durable)
        return int(info.num_ack_pending or 0)
    return 0


async def catch_up(js: JetStreamContext, spec: ConsumerSpec, held: int,
                   log: FilteringBoundLogger, limit_s: float = 5.0) -> None:
    """Before the first plan, wait until the consumer has applied what the
    stream holds for it (events of the interregnum), for at most ``limit_s``.
    The ``held`` events a killed leader took and never acked come again only
    after the consumer's ack wait; admission wrote their jobs' records, so
    the first plan does not wait for them."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(NotFoundError):  # not created yet
            info = await js.consumer_info(spec.stream, spec.durable)
            if info.num_pending == 0 and (info.num_ack_pending or 0) <= held:
                return
        await asyncio.sleep(0.05)
    log.warning("planning before every job event was applied")
