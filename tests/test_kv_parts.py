"""A stateful layer's state larger than one message: stored in compressed
parts in KV (services/runtime/kv.py), on a real nats-server whose buckets
refuse values over the payload limit."""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import KeyValueConfig
from nats.js.errors import Error as JetStreamError

from services.runtime.bus import connect, ensure_jetstream
from services.runtime.kv import PART_BYTES, is_part, pack, parts_of, read_bucket, unpack
from shared import subjects
from shared.wire import MAX_PAYLOAD
from tests.natsfix import nats_server, nats_url  # noqa: F401
from tests.test_runtime import settings_for


def big_state(jobs: int) -> bytes:
    """A HiveD-like state: each job with its cell addresses and virtual servers."""
    rng = random.Random(0)
    return msgspec.json.encode({"cells": {"jobs": [
        {"job_id": f"tenant-{i % 7}/job-{i:06d}", "cells": [
            f"GTX1080Ti:{rng.randrange(4096)}.{rng.randrange(2)}.{rng.randrange(2)}"]}
        for i in range(jobs)]}})


def test_a_small_value_is_stored_as_it_is_and_a_large_one_in_parts() -> None:
    assert pack("hived", b"{}") == [("hived", b"{}")]
    state = big_state(60_000)
    assert len(state) > 4 * MAX_PAYLOAD
    pairs = pack("hived", state)
    assert [k for k, _ in pairs][-1] == "hived" and all(is_part(k) for k, _ in pairs[:-1])
    assert len(pairs) > 2 and all(len(v) <= PART_BYTES for _, v in pairs)
    assert unpack("hived", dict(pairs)) == state
    part0 = pairs[0][0]
    assert parts_of("hived", pairs[-1][1]) == [k for k, _ in pairs[:-1]]
    values = dict(pairs)
    del values[part0]
    with pytest.raises(ValueError, match=rf"part '{re.escape(part0)}' is missing"):
        unpack("hived", values)
    first = dict(pairs)[part0]
    values = dict(pairs) | {part0: first[:-1] + bytes([first[-1] ^ 1])}
    with pytest.raises(ValueError, match="do not match its head"):
        unpack("hived", values)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:  # noqa: F811
    client = await connect(settings_for(nats_url), "test")
    yield client
    await client.close()


async def test_a_state_over_the_payload_limit_round_trips_through_kv(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_jetstream(js)
    # the bucket as an earlier version made it (the layout makes it no more)
    kv = await js.create_key_value(KeyValueConfig(bucket=subjects.KV_LAYERS, history=1))
    state = big_state(60_000)
    with pytest.raises((JetStreamError, nats.errors.Error)):
        await kv.put("hived", state)  # one message: refused
    for key, value in pack("hived", state):
        await kv.put(key, value)
    raw = {k: v.data for k, v in (await read_bucket(js, subjects.KV_LAYERS)).items()}
    assert unpack("hived", raw) == state
    # A writer killed after the parts of a new state, before its head: the
    # last head and its parts are untouched, so the last state reads back.
    newer = big_state(61_000)
    for key, value in pack("hived", newer)[:-1]:
        await kv.put(key, value)
    raw = {k: v.data for k, v in (await read_bucket(js, subjects.KV_LAYERS)).items()}
    assert unpack("hived", raw) == state
    for key, value in pack("hived", b'{"small": true}'):  # a smaller state later
        await kv.put(key, value)
    raw = {k: v.data for k, v in (await read_bucket(js, subjects.KV_LAYERS)).items()}
    assert unpack("hived", raw) == b'{"small": true}'
