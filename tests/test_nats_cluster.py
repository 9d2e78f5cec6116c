"""A NATS cluster of three real nats-servers (services/runtime/natscluster.py)
and the writes that ride out its leader elections (services/runtime/retry.py).

* The members route to each other and agree on a JetStream meta leader;
  streams and buckets made at R3 have a copy on each.
* kill -9 of a stream's leader: publishes retried with the same message id
  go on once the survivors elected another, and the stream holds every
  acknowledged message exactly once; the killed member comes back on its
  port and data dir and catches up.
* A KV write retried after its ack was lost is its own duplicate, not a
  conflict with itself; a real conflict raises as ``KeyValue.update`` does.
* The leader's large state (object store ``hops_state``, R3) is written
  through a kill -9 of its stream's leader and read back whole.
* A service at R1 leaves the R3 layout at R3; one at R5 fails within
  seconds with ``nats_replicas_exceed_cluster``, the sizes in words.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from services.runtime.bus import JetStreamLayout, LayoutError, ensure_jetstream
from services.runtime.layout import PLACEMENT_WAIT_S, REPLICAS_EXCEED_CLUSTER
from services.runtime.natscluster import NatsCluster, stream_leader
from services.runtime.objects import get_object, put_object, stream_of
from services.runtime.retry import kv_write, publish_retried
from shared import subjects
from tests.engines_nats import require_nats_server

require_nats_server()


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    nats_cluster = NatsCluster(tmp_path / "nats", 3)
    await asyncio.to_thread(nats_cluster.start)
    try:
        yield nats_cluster
    finally:
        await asyncio.to_thread(nats_cluster.stop)


@pytest_asyncio.fixture
async def nc(cluster: NatsCluster) -> AsyncIterator[NATS]:
    client = await nats.connect(servers=list(cluster.urls), max_reconnect_attempts=-1,
                                reconnect_time_wait=0.2)
    await ensure_jetstream(client.jetstream(), JetStreamLayout(replicas=3))
    try:
        yield client
    finally:
        await client.close()


async def test_members_agree_on_a_meta_leader_and_keep_three_copies(
        cluster: NatsCluster, nc: NATS) -> None:
    assert cluster.meta_leader() in {"hops-1", "hops-2", "hops-3"}
    assert len(set(cluster.urls)) == 3 and cluster.url.count(",") == 2
    info = await nc.jetstream().stream_info("KV_hops_leader")
    assert info.config.num_replicas == 3
    assert info.cluster is not None and len(info.cluster.replicas or ()) == 2


async def test_publishes_ride_out_a_killed_stream_leader(cluster: NatsCluster, nc: NATS) -> None:
    js = nc.jetstream()
    acked = 0

    async def write(n: int) -> float:
        began = time.monotonic()
        await publish_retried(js, subjects.job_events(f"j{n}"), b"x", msg_id=f"j{n}")
        return time.monotonic() - began

    for n in range(20):
        await write(n)
        acked += 1
    leader = await stream_leader(js, subjects.STREAM_JOBS.name)
    victim = cluster.member(leader)
    victim.kill()
    stalls = []
    for n in range(20, 40):
        stalls.append(await write(n))
        acked += 1
    assert max(stalls) > 0.5  # it did wait for an election (else the test proves nothing)
    assert await stream_leader(js, subjects.STREAM_JOBS.name) not in ("", leader)
    await asyncio.to_thread(victim.start)
    for n in range(40, 45):
        await write(n)
        acked += 1
    info = await js.stream_info(subjects.STREAM_JOBS.name)
    assert info.state.messages == acked == 45


async def test_a_retried_kv_write_is_its_own_duplicate_not_a_conflict(nc: NATS) -> None:
    js = nc.jetstream()
    first = await kv_write(js, subjects.KV_ALLOC, "j1", b"a", msg_id="j1:alloc:p1")
    again = await kv_write(js, subjects.KV_ALLOC, "j1", b"a", msg_id="j1:alloc:p1")
    assert again == first  # the ack of the write that landed, not a second revision
    second = await kv_write(js, subjects.KV_ALLOC, "j1", b"b", last=first, msg_id="j1:r:p2")
    assert await kv_write(js, subjects.KV_ALLOC, "j1", b"b", last=first,
                          msg_id="j1:r:p2") == second  # retried after it landed
    with pytest.raises(KeyWrongLastSequenceError):
        await kv_write(js, subjects.KV_ALLOC, "j1", b"c", last=first, msg_id="j1:r:p3")
    entry = await (await js.key_value(subjects.KV_ALLOC)).get("j1")
    assert (entry.value, entry.revision) == (b"b", second)


async def leader_after_election(js: JetStreamContext, stream: str) -> str:
    """The stream's leader, asked again while a request times out: the
    client may still be reconnecting from the killed server."""
    for _ in range(5):
        try:
            return await stream_leader(js, stream)
        except nats.errors.TimeoutError:
            continue
    return await stream_leader(js, stream)


async def test_the_leaders_state_rides_out_a_killed_object_store_leader(
        cluster: NatsCluster, nc: NATS) -> None:
    """The layer state at R3 in hops_state: kill -9 of that stream's leader
    under a write; the write goes on once another is elected, and a reader
    (a new scheduler leader) reads the newest state whole."""
    js = nc.jetstream()
    stream = stream_of(subjects.OBJ_STATE)
    info = await js.stream_info(stream)
    assert info.config.num_replicas == 3
    old, new = b'{"bindings": 1}' * 40_000, b'{"bindings": 2}' * 40_000
    await put_object(js, subjects.OBJ_STATE, "layer.hived", old)
    victim = cluster.member(await stream_leader(js, stream))
    victim.kill()
    began = time.monotonic()
    await put_object(js, subjects.OBJ_STATE, "layer.hived", new)
    assert time.monotonic() - began > 0.5  # it waited for an election
    assert await leader_after_election(js, stream) not in ("", victim.server_name)
    assert await get_object(js, subjects.OBJ_STATE, "layer.hived") == new
    await asyncio.to_thread(victim.start)


async def test_a_service_at_r1_does_not_lower_an_r3_layout(nc: NATS) -> None:
    """A service started without HOPS_NATS_REPLICAS (R1) against the R3
    layout: every stream, bucket and the object store stay at R3."""
    js = nc.jetstream()
    await ensure_jetstream(js, JetStreamLayout(replicas=1))
    counts = {str(i.config.name): i.config.num_replicas for i in await js.streams_info()}
    assert {"HOPS_JOBS", "KV_hops_leader", "OBJ_hops_state"} <= set(counts)
    assert set(counts.values()) == {3}, counts


async def test_replicas_above_the_clusters_size_fail_fast_saying_why(
        cluster: NatsCluster) -> None:
    """HOPS_NATS_REPLICAS=5 on a cluster of three: a coded reason within
    the placement wait, not a bare timeout after a minute."""
    client = await nats.connect(servers=list(cluster.urls))
    try:
        began = time.monotonic()
        with pytest.raises(LayoutError) as refused:
            await ensure_jetstream(client.jetstream(), JetStreamLayout(replicas=5))
        assert time.monotonic() - began < PLACEMENT_WAIT_S + 10.0
        assert refused.value.code == REPLICAS_EXCEED_CLUSTER
        assert str(refused.value).startswith(
            "HOPS_NATS_REPLICAS=5 but the NATS cluster has 3 JetStream servers:"), refused.value
    finally:
        await client.close()
