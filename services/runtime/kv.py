"""Reading every current value of a KV bucket in one pass.

nats-py's ``KeyValue.keys()`` and ``watchall()`` end the initial values
with a ``None`` marker that they place when a consumer-info reply says
nothing is pending and no message has arrived yet. The server sends that
reply and the messages independently, so on a busy host the reply can
overtake them and a bucket with keys reads as empty (seen: 2 reads in 500
with the CPU shared by other processes). :func:`read_bucket` does not rely
on that marker: it checks that the bucket's stream holds anything, then
reads the last message of every key with an ordered consumer and stops at
the message after which the server has nothing pending for it.

:func:`pack` and :func:`unpack` store a value larger than one message in
compressed parts: how earlier versions kept the leader's large state, still
read where no object of :mod:`services.runtime.objects` holds it yet.
"""

from __future__ import annotations

import asyncio
import hashlib
import zlib
from collections.abc import Mapping
from typing import NamedTuple

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

_DELETED = ("DEL", "PURGE")


class Value(NamedTuple):
    """A key's current value and its revision (the stream sequence)."""

    data: bytes
    revision: int


class Snapshot(NamedTuple):
    """A bucket's values as of ``revision``: the stream sequence of the last
    message read (for an empty bucket, its last sequence); two reads with the same
    revision read the same values."""

    values: dict[str, Value]
    revision: int


async def read_bucket(js: JetStreamContext, bucket: str, timeout: float = 10.0) -> dict[str, Value]:
    """Every key of KV ``bucket`` that has a value (deleted keys left out).
    Raises ``TimeoutError`` when the values do not arrive within ``timeout``."""
    return (await read_snapshot(js, bucket, timeout)).values


async def read_snapshot(js: JetStreamContext, bucket: str, timeout: float = 10.0) -> Snapshot:
    """:func:`read_bucket` with the revision it read up to. The last message
    of every key is delivered in stream order, so the last one read, where
    the server has nothing pending, is the stream's last message then."""
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    messages, last = await _stream_state(js, stream)
    if not messages:
        return Snapshot({}, last)
    sub = await js.subscribe(
        f"{prefix}>",
        stream=stream,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: dict[str, Value] = {}
    revision = last
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"KV {bucket}: the values did not arrive in {timeout:g} s")
            try:
                msg = await sub.next_msg(timeout=min(left, 0.5))
            except nats.errors.TimeoutError:
                messages, last = await _stream_state(js, stream)
                if not messages:  # e.g. the last entries expired meanwhile
                    return Snapshot(out, last)
                continue
            key = msg.subject[len(prefix) :]
            revision = msg.metadata.sequence.stream
            headers = msg.headers or {}
            if headers.get("KV-Operation") in _DELETED or "Nats-Marker-Reason" in headers:
                out.pop(key, None)
            else:
                out[key] = Value(msg.data, msg.metadata.sequence.stream)
            if msg.metadata.num_pending == 0:
                return Snapshot(out, revision)
    finally:
        await sub.unsubscribe()


async def _stream_state(js: JetStreamContext, stream: str) -> tuple[int, int]:
    """How many messages the stream holds, and its last sequence."""
    info = await js.stream_info(stream)
    return info.state.messages, info.state.last_seq


# A value larger than one part is stored compressed, in parts: keys
# "<key>.part<i>-<digest>" hold the zlib stream in order and "<key>" a head
# naming their count and digest. Parts are named after the value they hold
# and written before the head, so a writer killed half-way leaves the last
# head and its parts as they were; the writer deletes the parts of the head
# it replaced afterwards (:func:`parts_of`).
CHUNKED = b"\x00hops-parts:"
PART_BYTES = 192 * 1024  # under the payload limit (shared.wire.MAX_PAYLOAD), headers aside


def _part(key: str, i: int, digest: str) -> str:
    return f"{key}.part{i}-{digest[:16]}"


def pack(key: str, data: bytes, limit: int = PART_BYTES) -> list[tuple[str, bytes]]:
    """The (key, value) pairs that store ``data`` under ``key``, in write order."""
    if len(data) <= limit and not data.startswith(CHUNKED):
        return [(key, data)]
    packed = zlib.compress(data, 6)
    digest = hashlib.sha256(packed).hexdigest()
    parts = [packed[i:i + limit] for i in range(0, len(packed), limit)]
    head = CHUNKED + f"{len(parts)}:{digest}".encode()
    return [*((_part(key, i, digest), p) for i, p in enumerate(parts)), (key, head)]


def is_part(key: str) -> bool:
    """Whether ``key`` holds a part of another key's value."""
    return ".part" in key


def parts_of(key: str, data: bytes) -> list[str]:
    """The part keys the value ``data`` of ``key`` names (none for a plain value)."""
    if not data.startswith(CHUNKED):
        return []
    count, digest = data[len(CHUNKED):].decode().split(":")
    return [_part(key, i, digest) for i in range(int(count))]


def unpack(key: str, values: Mapping[str, bytes]) -> bytes:
    """The value stored under ``key`` (:func:`pack`); ValueError when a
    part is missing or does not match the head's digest."""
    data = values[key]
    names = parts_of(key, data)
    if not names:
        return data
    try:
        packed = b"".join(values[name] for name in names)
    except KeyError as e:
        raise ValueError(f"KV {key}: part {e} is missing") from None
    if hashlib.sha256(packed).hexdigest() != data[len(CHUNKED):].decode().split(":")[1]:
        raise ValueError(f"KV {key}: its parts do not match its head")
    return zlib.decompress(packed)
