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
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

_DELETED = ("DEL", "PURGE")


class Value(NamedTuple):
    """A key's current value and its revision (the stream sequence)."""

    data: bytes
    revision: int


async def read_bucket(js: JetStreamContext, bucket: str, timeout: float = 10.0) -> dict[str, Value]:
    """Every key of KV ``bucket`` that has a value (deleted keys left out).
    Raises ``TimeoutError`` when the values do not arrive within ``timeout``."""
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    if await _empty(js, stream):
        return {}
    sub = await js.subscribe(
        f"{prefix}>",
        stream=stream,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: dict[str, Value] = {}
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"KV {bucket}: the values did not arrive in {timeout:g} s")
            try:
                msg = await sub.next_msg(timeout=min(left, 0.5))
            except nats.errors.TimeoutError:
                if await _empty(js, stream):  # e.g. the last entries expired meanwhile
                    return out
                continue
            key = msg.subject[len(prefix) :]
            headers = msg.headers or {}
            if headers.get("KV-Operation") in _DELETED or "Nats-Marker-Reason" in headers:
                out.pop(key, None)
            else:
                out[key] = Value(msg.data, msg.metadata.sequence.stream)
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()


async def _empty(js: JetStreamContext, stream: str) -> bool:
    info = await js.stream_info(stream)
    return info.state.messages == 0
