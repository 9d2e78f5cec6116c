"""The leader's large state in JetStream's object store (services/runtime/
objects.py, bucket hops_state), on a real nats-server: round trips in
nats-py's format, a reader never sees a half-written version, a new leader
(a new LayerStore, the server restarted) reloads it, and a state that an
earlier version left in KV parts (hops_layers) is still read."""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig

from services.runtime.bus import ErrorReporter, connect, ensure_jetstream
from services.runtime.kv import pack
from services.runtime.layout import JetStreamLayout
from services.runtime.logging import get_logger
from services.runtime.natsd import EmbeddedNats
from services.runtime.objects import (
    CHUNK_BYTES,
    ObjectError,
    ObjectWriter,
    chunk_subject,
    get_object,
    object_names,
    put_object,
    read_info,
    stream_of,
)
from services.runtime.service import ServiceContext
from services.scheduler.layer_store import LayerStore
from services.scheduler.settings import SchedulerSettings
from shared import subjects
from shared.snapshot import LayerRecord
from tests.natsfix import nats_server, nats_url  # noqa: F401
from tests.test_kv_parts import big_state
from tests.test_runtime import settings_for

BUCKET = subjects.OBJ_STATE


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:  # noqa: F811
    client = await connect(settings_for(nats_url), "test")
    await ensure_jetstream(client.jetstream())
    yield client
    await client.close()


def incompressible(size: int, seed: int) -> bytes:
    """Bytes zlib cannot shrink, so that a value spans many chunks."""
    return random.Random(seed).randbytes(size)


async def test_the_bucket_is_made_with_the_layout_replicas_and_limits(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_jetstream(js, JetStreamLayout(state_max_bytes=2**31))  # again: updated
    info = await js.stream_info(stream_of(BUCKET))
    assert info.config.num_replicas == 1 and info.config.max_bytes == 2**31
    assert info.config.subjects == [f"$O.{BUCKET}.C.>", f"$O.{BUCKET}.M.>"]


async def test_a_large_state_round_trips_and_nats_py_reads_it(nc: NATS) -> None:
    js = nc.jetstream()
    assert await get_object(js, BUCKET, "layer.hived") is None
    state = big_state(60_000)
    info = await put_object(js, BUCKET, "layer.hived", state)
    assert info.chunks is not None and info.chunks > 1
    assert await get_object(js, BUCKET, "layer.hived") == state
    assert await object_names(js, BUCKET) == ["layer.hived"]
    # nats-py's own reader checks the digest and returns the stored (zlib) bytes
    store = await js.object_store(BUCKET)
    got = await store.get("layer.hived")
    assert zlib.decompress(got.data) == state
    # and a value nats-py wrote (uncompressed, no header) reads back as it is
    await store.put("other", b"plain bytes")
    assert await get_object(js, BUCKET, "other") == b"plain bytes"


async def test_a_reader_never_sees_a_half_written_state(nc: NATS) -> None:
    js = nc.jetstream()
    # enough chunks that the writer is still writing when the first one's copy
    # reaches the test (under load, 12 were all acknowledged before it did)
    old, new = incompressible(64 * CHUNK_BYTES, 1), incompressible(64 * CHUNK_BYTES, 2)
    await put_object(js, BUCKET, "layer.hived", old)
    # a writer killed after its first chunk: the readers read the old version
    first = asyncio.Event()

    async def seen(msg: Msg) -> None:
        first.set()

    await nc.subscribe(f"$O.{BUCKET}.C.>", cb=seen)
    writer = asyncio.create_task(put_object(js, BUCKET, "layer.hived", new))
    await asyncio.wait_for(first.wait(), 10)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert await get_object(js, BUCKET, "layer.hived") == old
    # readers during a whole write: each one reads one version, whole
    writer = asyncio.create_task(put_object(js, BUCKET, "layer.hived", new))
    reads: list[bytes | None] = []
    while not writer.done():
        reads.append(await get_object(js, BUCKET, "layer.hived"))
    await writer
    reads.append(await get_object(js, BUCKET, "layer.hived"))
    assert set(reads) <= {old, new} and reads[-1] == new, {len(r or b"") for r in reads}


async def test_a_version_outlives_one_write_and_is_purged_at_the_next(nc: NATS) -> None:
    js = nc.jetstream()
    await put_object(js, BUCKET, "s", b"v1")
    v1 = await read_info(js, BUCKET, "s")
    await put_object(js, BUCKET, "s", b"v2")
    assert v1 is not None
    chunks = (await js.stream_info(stream_of(BUCKET), subjects_filter=f"$O.{BUCKET}.C.>")
              ).state.subjects or {}
    assert chunk_subject(BUCKET, v1.nuid) in chunks  # a reader of v1's meta still reads it
    await put_object(js, BUCKET, "s", b"v3")
    chunks = (await js.stream_info(stream_of(BUCKET), subjects_filter=f"$O.{BUCKET}.C.>")
              ).state.subjects or {}
    assert chunk_subject(BUCKET, v1.nuid) not in chunks and len(chunks) == 2
    assert await get_object(js, BUCKET, "s") == b"v3"


async def chunk_subjects(js: JetStreamContext) -> set[str]:
    info = await js.stream_info(stream_of(BUCKET), subjects_filter=f"$O.{BUCKET}.C.>")
    return set(info.state.subjects or {})


async def test_a_writer_writes_without_reading_and_purges_when_it_tidies(nc: NATS) -> None:
    js = nc.jetstream()
    await put_object(js, BUCKET, "t", b"v0")  # a last term's version: the writer reads it once
    writer = ObjectWriter(js, BUCKET, "t")
    versions = [await writer.put(b"v%d" % i) for i in (1, 2, 3)]
    assert await get_object(js, BUCKET, "t") == b"v3"
    stored = await read_info(js, BUCKET, "t")
    assert stored is not None and stored.nuid == versions[-1].nuid
    # each meta names the version before, v1's the last term's: one chain
    assert len(await chunk_subjects(js)) == 4  # every version's chunks, none purged yet
    assert len(writer.stale) == 2
    await writer.tidy()  # v0's and v1's chunks go; v2's stay for a reader of its meta
    left = await chunk_subjects(js)
    assert left == {chunk_subject(BUCKET, v.nuid) for v in versions[1:]}
    assert writer.stale == [] and await get_object(js, BUCKET, "t") == b"v3"
    # once its put failed (the meta may be stored after all) the writer reads
    # the stored meta before its next write: another version written meanwhile
    # is then named as the one before, and its predecessor purged
    writer.known = False
    await put_object(js, BUCKET, "t", b"other")
    await writer.put(b"v4")
    await writer.tidy()
    assert await get_object(js, BUCKET, "t") == b"v4"
    assert len(await chunk_subjects(js)) == 2  # "other" and v4: nothing left over


def store_for(nc: NATS, term: int) -> LayerStore:
    ctx = ServiceContext("scheduler", settings_for("nats://unused"), nc, nc.jetstream(),
                         get_logger(), ErrorReporter(nc, "scheduler"))
    return LayerStore(ctx, SchedulerSettings(), term, f"scheduler-{term}")


async def test_a_new_leader_reloads_the_layer_state_after_a_server_restart(
    nats_server: EmbeddedNats,  # noqa: F811
) -> None:
    state = big_state(60_000)
    nc = await connect(settings_for(nats_server.url), "test")
    await ensure_jetstream(nc.jetstream())
    first = store_for(nc, 1)
    await first.open(nc.jetstream())
    assert await first.load() == {}
    await first.save([LayerRecord("hived", state=state), LayerRecord("plain")])
    await nc.close()
    nats_server.stop()
    nats_server.start()  # the same data directory
    nc = await connect(settings_for(nats_server.url), "test")
    try:
        second = store_for(nc, 2)
        await second.open(nc.jetstream())
        assert await second.load() == {"hived": state}
        assert second.snapshot_state() == {"hived": state}
    finally:
        await nc.close()


async def test_a_state_left_in_kv_parts_by_an_earlier_version_is_read_until_replaced(
        nc: NATS) -> None:
    js = nc.jetstream()
    # the bucket as an earlier version made it (the layout makes it no more)
    kv = await js.create_key_value(KeyValueConfig(bucket=subjects.KV_LAYERS, history=1))
    old, new = big_state(60_000), big_state(61_000)
    for key, value in [*pack("hived", old), *pack("coda", b'{"climbs": {}}')]:
        await kv.put(key, value)
    store = store_for(nc, 1)
    await store.open(js)
    assert await store.load() == {"hived": old, "coda": b'{"climbs": {}}'}
    await store.save([LayerRecord("hived", state=new)])
    assert await store_for(nc, 2).load() == {"hived": new, "coda": b'{"climbs": {}}'}
    assert await get_object(js, BUCKET, "layer.hived") == new


async def test_an_object_whose_chunks_are_gone_is_unreadable_and_the_layer_starts_afresh(
        nc: NATS) -> None:
    js = nc.jetstream()
    info = await put_object(js, BUCKET, "layer.hived", big_state(6_000))
    await js.purge_stream(stream_of(BUCKET), subject=chunk_subject(BUCKET, info.nuid))
    with pytest.raises(ObjectError, match="its chunks are gone"):
        await get_object(js, BUCKET, "layer.hived", timeout=5)
    assert await store_for(nc, 1).load() == {}
