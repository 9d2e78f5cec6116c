"""Reading the scheduler's KV buckets: job records with their revisions, and
whole buckets decoded leniently (a bad entry is logged and skipped)."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from structlog.typing import FilteringBoundLogger

from services.runtime.kv import read_bucket as kv_read
from services.scheduler import live_state as st
from services.scheduler.live_state import LiveJobRecord

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
