"""Large state in JetStream's object store (bucket ``hops_state``,
docs/tenancy.md "Where the layer state is kept").

An object is a run of chunks on ``$O.<bucket>.C.<nuid>`` followed by one
meta message on ``$O.<bucket>.M.<name in base64>`` that names the nuid, the
size and the SHA-256 of the chunks: nats-py's and the ``nats`` CLI's
format, so either reads what is written here. The meta message is a
subject rollup, so a reader sees the last complete version or the one
before, never a half-written one.

Written here rather than with nats-py's ``ObjectStore.put`` for two reasons
seen on a cluster during a leader election: nats-py publishes each message
once, and when the meta's ack is lost it purges the chunks that the meta,
stored after all, names (a broken object). Here every message is published
with :func:`services.runtime.retry.publish_retried` and an id of its own,
so a write rides out an election and stores each message once. And a
version's chunks are purged one write later than nats-py does (the meta
names its predecessor's nuid), so that a reader that read the old meta just
before a write still finds its chunks.

The value is stored compressed (zlib), marked so in the meta's headers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
import uuid
import zlib
from datetime import UTC, datetime

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import Header, ObjectInfo, ObjectMetaOptions
from nats.js.errors import NotFoundError

from services.runtime.retry import PUBLISH_RETRY_S, TRANSIENT, publish_retried, transient_retried

CHUNK_BYTES = 128 * 1024  # nats-py's default chunk, under the payload limit
INLINE_BYTES = 64 * 1024  # compressed on the event loop up to this size (about 1 ms)
READ_TIMEOUT_S = 10.0
PREVIOUS = "Hops-Previous"  # meta header: the nuid of the version before
ENCODING = "Hops-Encoding"  # meta header: how the chunks are compressed
_ZLIB = "zlib"
_DIGEST = "SHA-256="


class ObjectError(ValueError):
    """An object whose chunks do not match its meta (size or digest)."""


def stream_of(bucket: str) -> str:
    return f"OBJ_{bucket}"


def meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def chunk_subject(bucket: str, nuid: str) -> str:
    return f"$O.{bucket}.C.{nuid}"


def _header(info: ObjectInfo, key: str) -> str | None:
    value = (info.headers or {}).get(key)
    if isinstance(value, list):  # Go's nats.Header: each key a list
        return str(value[0]) if value else None
    return None if value is None else str(value)


async def read_info(js: JetStreamContext, bucket: str, name: str) -> ObjectInfo | None:
    """The meta of object ``name`` (None: none, or deleted)."""
    try:
        msg = await js.get_last_msg(stream_of(bucket), meta_subject(bucket, name), direct=True)
    except NotFoundError:
        return None
    info = ObjectInfo.from_response(json.loads(msg.data or b"{}"))
    return None if info.deleted else info


async def put_object(js: JetStreamContext, bucket: str, name: str, data: bytes, *,
                     within: float = PUBLISH_RETRY_S) -> ObjectInfo:
    """Store ``data`` (compressed) as object ``name``: chunks, then the meta,
    each retried through a leader election for up to ``within`` seconds;
    then the chunks of the version before the one replaced are purged."""
    current = await transient_retried(lambda: read_info(js, bucket, name), within)
    info = await _write(js, bucket, name, data, current, within)
    await _purge(js, bucket, _stale(current, info))
    return info


class ObjectWriter:
    """One object written again and again by one writer (a leader's state,
    before each revision it sends), with two round trips fewer than
    :func:`put_object` on the writer's path: the meta it wrote last stands
    for the current one (read once, and again after a failed write), and the
    chunks a write makes garbage are purged by :meth:`tidy`, which the
    writer calls when it has time. A version's chunks still go one write
    after :func:`put_object`'s (module docstring)."""

    def __init__(self, js: JetStreamContext, bucket: str, name: str,
                 within: float = PUBLISH_RETRY_S) -> None:
        self.js, self.bucket, self.name, self.within = js, bucket, name, within
        self.current: ObjectInfo | None = None
        self.known = False  # whether ``current`` is the stored meta, as far as this writer knows
        self.stale: list[str] = []  # nuids whose chunks are garbage, not purged yet

    async def put(self, data: bytes) -> ObjectInfo:
        """Store ``data`` as the object (:func:`put_object`, without the purge)."""
        if not self.known:
            self.current = await transient_retried(
                lambda: read_info(self.js, self.bucket, self.name), self.within)
            self.known = True
        try:
            info = await _write(self.js, self.bucket, self.name, data, self.current, self.within)
        except BaseException:
            self.known = False  # the meta may be stored after all: read it before the next
            raise
        stale = _stale(self.current, info)
        if stale:
            self.stale.append(stale)
        self.current = info
        return info

    async def tidy(self) -> None:
        """Purge the chunks of the versions :meth:`put` made garbage (left
        where a purge fails: garbage, never a current version's)."""
        stale, self.stale = self.stale, []
        for nuid in stale:
            await _purge(self.js, self.bucket, nuid)


async def _write(js: JetStreamContext, bucket: str, name: str, data: bytes,
                 current: ObjectInfo | None, within: float) -> ObjectInfo:
    """Chunks, then the meta naming ``current`` as the version before."""
    if len(data) <= INLINE_BYTES:  # a thread's hop costs more than compressing a little
        packed = zlib.compress(data, 6)
    else:  # 3.6 MiB take 50 ms to compress: off the event loop (zlib frees the GIL)
        packed = await asyncio.to_thread(zlib.compress, data, 6)
    nuid = uuid.uuid4().hex
    subject = chunk_subject(bucket, nuid)
    chunks = [packed[i:i + CHUNK_BYTES] for i in range(0, len(packed), CHUNK_BYTES)]
    for i, chunk in enumerate(chunks):
        await publish_retried(js, subject, chunk, msg_id=f"{nuid}.{i}", within=within)
    headers = {ENCODING: [_ZLIB]}
    if current is not None:
        headers[PREVIOUS] = [current.nuid]
    info = ObjectInfo(
        name=name, bucket=bucket, nuid=nuid, size=len(packed), chunks=len(chunks),
        mtime=datetime.now(UTC).isoformat(), headers=headers,
        digest=_DIGEST + base64.urlsafe_b64encode(hashlib.sha256(packed).digest()).decode(),
        options=ObjectMetaOptions(max_chunk_size=CHUNK_BYTES))
    await publish_retried(js, meta_subject(bucket, name), json.dumps(info.as_dict()).encode(),
                          msg_id=f"{nuid}.meta", headers={Header.ROLLUP: "sub"},
                          within=within)
    return info


def _stale(current: ObjectInfo | None, written: ObjectInfo) -> str | None:
    """The nuid whose chunks are garbage once ``written`` replaced
    ``current``: the version before ``current``."""
    stale = None if current is None else _header(current, PREVIOUS)
    return stale if stale and stale != written.nuid else None


async def _purge(js: JetStreamContext, bucket: str, nuid: str | None) -> None:
    if nuid:  # garbage from now on; left if the purge fails
        with contextlib.suppress(*TRANSIENT, nats.errors.Error):
            await js.purge_stream(stream_of(bucket), subject=chunk_subject(bucket, nuid))


async def get_object(js: JetStreamContext, bucket: str, name: str,
                     timeout: float = READ_TIMEOUT_S) -> bytes | None:
    """The value of object ``name`` (None: there is none). A version replaced
    twice while it is read is read again from its newer meta; ``TimeoutError``
    when it cannot be read within ``timeout``, :class:`ObjectError` when its
    chunks do not match its meta."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = await read_info(js, bucket, name)
            if info is None:
                return None
            packed = await _read_chunks(js, bucket, info, deadline)
        except nats.errors.TimeoutError:
            # a request lost while the client reconnects (its server was
            # killed in an election): asked again, within the same deadline
            if time.monotonic() >= deadline:
                raise
            continue
        if packed is not None and _header(info, ENCODING) == _ZLIB:
            return await asyncio.to_thread(zlib.decompress, packed)
        if packed is not None:
            return packed


async def _read_chunks(js: JetStreamContext, bucket: str, info: ObjectInfo,
                       deadline: float) -> bytes | None:
    """The chunks ``info`` names, checked; None when a newer meta replaced it
    and they are gone."""
    if not info.size:
        return b""
    sub = await js.subscribe(chunk_subject(bucket, info.nuid), stream=stream_of(bucket),
                             ordered_consumer=True)
    parts: list[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"object {info.name}: its chunks did not arrive in time")
            try:
                msg = await sub.next_msg(timeout=min(left, 0.5))
            except nats.errors.TimeoutError:
                newer = await read_info(js, bucket, info.name)
                if newer is None or newer.nuid != info.nuid:
                    return None
                await _chunks_stored(js, bucket, info)
                continue
            parts.append(msg.data)
            if msg.metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return _checked(info, b"".join(parts))


async def _chunks_stored(js: JetStreamContext, bucket: str, info: ObjectInfo) -> None:
    """:class:`ObjectError` when the stream holds fewer chunks than the
    current meta names (purged under it: no wait brings them back)."""
    subject = chunk_subject(bucket, info.nuid)
    state = (await js.stream_info(stream_of(bucket), subjects_filter=subject)).state
    if (state.subjects or {}).get(subject, 0) < (info.chunks or 0):
        raise ObjectError(f"object {info.name}: its chunks are gone")


def _checked(info: ObjectInfo, packed: bytes) -> bytes:
    digest = _DIGEST + base64.urlsafe_b64encode(hashlib.sha256(packed).digest()).decode()
    if len(packed) != info.size or digest != info.digest:
        raise ObjectError(f"object {info.name}: its chunks do not match its meta")
    return packed


async def object_names(js: JetStreamContext, bucket: str) -> list[str]:
    """The names of the objects ``bucket`` holds (deleted ones included)."""
    info = await js.stream_info(stream_of(bucket), subjects_filter=f"$O.{bucket}.M.>")
    prefix = len(f"$O.{bucket}.M.")
    return sorted(base64.urlsafe_b64decode(s[prefix:]).decode()
                  for s in (info.state.subjects or {}))


async def read_retried(js: JetStreamContext, bucket: str, name: str,
                       within: float = PUBLISH_RETRY_S) -> bytes | None:
    """:func:`get_object`, again while JetStream elects a leader."""
    return await transient_retried(lambda: get_object(js, bucket, name), within)
