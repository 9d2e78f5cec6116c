"""Writing and reading the leader's large state: KV parts against JetStream's
object store (``python bench/layer_state_store.py --rounds 40``).

A HiveD-like layer state (each job with its cell address, as
``tests/test_kv_parts.py`` builds it; 60,000 jobs are 3.6 MiB) is written
and read back ``--rounds`` times, each round a slightly different state,
three ways:

- ``kv-parts``: as the leader did before the object store, compressed
  parts in KV ``hops_layers`` then a head (``services.runtime.kv.pack``),
  the replaced parts deleted; read with ``read_bucket`` and ``unpack``;
- ``object``: ``services.runtime.objects.put_object`` / ``get_object`` in
  ``hops_state`` (compressed, each message retried through an election);
- ``nats-py object``: nats-py's own ``ObjectStore.put`` / ``get``, the
  state uncompressed, in the same bucket.

On one nats-server, and on three routed ones (``NatsCluster``) with every
stream and bucket at R3 (the layout's replicas). Printed: p50 and p99 of
each write and read, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import msgspec
import nats
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType

from services.runtime.bus import JetStreamLayout, ensure_jetstream
from services.runtime.kv import is_part, pack, parts_of, read_bucket, unpack
from services.runtime.natscluster import NatsCluster
from services.runtime.objects import get_object, put_object
from shared import subjects

Timed = Callable[[bytes], Awaitable[bytes | None]]


def layer_state(jobs: int, seed: int) -> bytes:
    """Each job with its cell address and virtual server, as HiveD keeps them."""
    rng = random.Random(seed)
    return msgspec.json.encode({"cells": {"jobs": [
        {"job_id": f"tenant-{i % 7}/job-{i:06d}", "cells": [
            f"GTX1080Ti:{rng.randrange(4096)}.{rng.randrange(2)}.{rng.randrange(2)}"]}
        for i in range(jobs)]}})


async def _kv_parts(js: JetStreamContext) -> tuple[Timed, Timed]:
    kv = await js.key_value(subjects.KV_LAYERS)
    held: list[str] = []

    async def write(state: bytes) -> bytes | None:
        pairs = pack("hived", state)
        for key, value in pairs:
            await kv.put(key, value)
        for key in sorted(set(held) - {k for k, _ in pairs}):
            await kv.delete(key)
        held[:] = parts_of("hived", pairs[-1][1])
        return None

    async def read(_: bytes) -> bytes | None:
        raw = {k: v.data for k, v in (await read_bucket(js, subjects.KV_LAYERS)).items()
               if v.data}
        assert all(is_part(k) for k in raw if k != "hived")
        return unpack("hived", raw)

    return write, read


async def _objects(js: JetStreamContext) -> tuple[Timed, Timed]:
    async def write(state: bytes) -> bytes | None:
        await put_object(js, subjects.OBJ_STATE, "layer.hived", state)
        return None

    async def read(_: bytes) -> bytes | None:
        return await get_object(js, subjects.OBJ_STATE, "layer.hived")

    return write, read


async def _nats_py(js: JetStreamContext) -> tuple[Timed, Timed]:
    store = await js.object_store(subjects.OBJ_STATE)

    async def write(state: bytes) -> bytes | None:
        await store.put("nats-py.hived", state)
        return None

    async def read(_: bytes) -> bytes | None:
        return (await store.get("nats-py.hived")).data

    return write, read


WAYS = {"kv-parts": _kv_parts, "object": _objects, "nats-py object": _nats_py}


def _ms(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {q[49] * 1000:7.1f} ms  p99 {q[98] * 1000:7.1f} ms"


async def _bench(urls: list[str], replicas: int, states: list[bytes], label: str) -> None:
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1)
    js = nc.jetstream(timeout=30.0)
    await ensure_jetstream(js, JetStreamLayout(replicas=replicas))
    # the earlier versions' bucket, which the layout no longer makes
    await js.create_key_value(KeyValueConfig(bucket=subjects.KV_LAYERS, history=1,
                                             storage=StorageType.FILE, replicas=replicas))
    for way, make in WAYS.items():
        write, read = await make(js)
        writes, reads = [], []
        for state in states:
            t0 = time.perf_counter()
            await write(state)
            t1 = time.perf_counter()
            back = await read(state)
            t2 = time.perf_counter()
            assert back == state, way
            writes.append(t1 - t0)
            reads.append(t2 - t1)
        print(f"{label:<13} {way:<15} write {_ms(writes)}   read {_ms(reads)}", flush=True)
    with contextlib.suppress(Exception):
        await nc.close()


async def run(rounds: int, jobs: int, sizes: list[int]) -> None:
    states = [layer_state(jobs, seed) for seed in range(rounds)]
    print(f"state: {jobs} jobs, {len(states[0]) / 2**20:.1f} MiB; {rounds} rounds", flush=True)
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp, NatsCluster(tmp, size) as cluster:
            label = "1 server" if size == 1 else f"{size} servers R{size}"
            await _bench(list(cluster.urls), size, states, label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="writes and reads of each way")
    parser.add_argument("--jobs", type=int, default=60_000, help="jobs in the layer state")
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 3],
                        help="cluster sizes to run on (replicas = size)")
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.jobs, args.servers))


if __name__ == "__main__":
    main()
