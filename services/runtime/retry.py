"""Writes to JetStream that ride out a leader election (docs/live.md, *A
NATS cluster*).

On a cluster, every stream and KV bucket has a leader among the servers
that keep a copy. When it dies, the others elect a new one; until then a
write to that stream fails fast (no responders, 503) or waits for an ack
that never comes. :func:`publish_retried` tries again, with the same
``Nats-Msg-Id`` each time so that JetStream stores one copy even when an
earlier attempt's ack was lost, until :data:`PUBLISH_RETRY_S` is up;
:func:`kv_write` does the same for a KV put or a compare-and-set update.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

# JetStream elects a new leader for a stream within 4-8 s of losing one
# (measured: bench/nats_election.py, docs/live.md). Meanwhile a publish fails
# fast (no responders, 503) or waits for an ack that never comes: retried,
# with the same message id so that JetStream keeps one copy, for longer than
# the longest election measured; each attempt waits this long for its ack.
PUBLISH_RETRY_S = 12.0
PUBLISH_ATTEMPT_S = 2.0
_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.5)  # the last again and again
T = TypeVar("T")
_WRONG_LAST_SEQUENCE = 10071  # JetStream: wrong last sequence
# What a publish raises while its stream has no leader or its server is gone.
TRANSIENT = (NoStreamResponseError, ServiceUnavailableError, nats.errors.TimeoutError,
             nats.errors.NoRespondersError, nats.errors.ConnectionReconnectingError,
             TimeoutError)


async def publish_retried(
    js: JetStreamContext,
    subject: str,
    data: bytes,
    *,
    msg_id: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
    within: float = PUBLISH_RETRY_S,
) -> PubAck:
    """``js.publish`` retried on :data:`TRANSIENT` errors for up to ``within``
    seconds (a leader election), each attempt waiting ``timeout`` (default
    :data:`PUBLISH_ATTEMPT_S`) for the ack; the last error once the time is
    up. Every attempt carries the same ``Nats-Msg-Id`` (a fresh one when
    none is given), so that an attempt whose ack was lost is not stored
    twice; a retry answered *duplicate* is that earlier attempt's ack."""
    headers = {**(headers or {}), "Nats-Msg-Id": msg_id or uuid.uuid4().hex}
    deadline = time.monotonic() + within
    for attempt in itertools.count():
        try:
            ack = await js.publish(subject, data, timeout=timeout or PUBLISH_ATTEMPT_S,
                                   headers=headers)
        except TRANSIENT:
            pause = _PAUSES_S[min(attempt, len(_PAUSES_S) - 1)]
            if time.monotonic() + pause >= deadline:
                raise
            await asyncio.sleep(pause)
            continue
        return dataclasses.replace(ack, duplicate=None) if attempt and ack.duplicate else ack
    raise AssertionError("unreachable")


async def transient_retried(call: Callable[[], Awaitable[T]], within: float = PUBLISH_RETRY_S,
                            ) -> T:
    """``call()`` again while it raises :data:`TRANSIENT` (a JetStream API
    request while the cluster elects its meta leader), for up to ``within``
    seconds; for idempotent calls only (creating a stream, a bucket)."""
    deadline = time.monotonic() + within
    for attempt in itertools.count():
        try:
            return await call()
        except TRANSIENT:
            pause = _PAUSES_S[min(attempt, len(_PAUSES_S) - 1)]
            if time.monotonic() + pause >= deadline:
                raise
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")


async def kv_write(
    js: JetStreamContext,
    bucket: str,
    key: str,
    value: bytes,
    *,
    last: int | None = None,
    msg_id: str | None = None,
    within: float = PUBLISH_RETRY_S,
) -> int:
    """Put ``value`` under ``key`` in ``bucket`` (only if the key's revision
    is still ``last``, when given) and return the new revision, retried as
    :func:`publish_retried`. A lost compare-and-set raises
    ``nats.js.errors.KeyWrongLastSequenceError`` as ``KeyValue.update`` does;
    the id makes a retry of a write that landed its duplicate, not a
    conflict with itself (JetStream checks the id first)."""
    headers = {"Nats-Expected-Last-Subject-Sequence": str(last)} if last is not None else None
    try:
        ack = await publish_retried(js, f"$KV.{bucket}.{key}", value, msg_id=msg_id,
                                    headers=headers, within=within)
    except nats.js.errors.APIError as e:
        if e.err_code == _WRONG_LAST_SEQUENCE:
            raise nats.js.errors.KeyWrongLastSequenceError(description=e.description) from None
        raise
    return ack.seq
