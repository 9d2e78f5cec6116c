"""Pages of ``GET /jobs``: filters, the limit and the cursor, without I/O.

Jobs are listed oldest submission first, ties by job id. A page ends where
its ``limit`` is reached; ``next_cursor`` then names the sort key of its
last job, and the next page starts after that key. Because the cursor is a
key, not an offset, it is stable across inserts and deletions: a job
submitted while a client pages is never listed twice and never shifts
another job out of the listing (new jobs sort last, since the scheduler
stamps ``submitted_at`` at acceptance). Clients treat the cursor as opaque:
URL-safe base64 of a small versioned JSON object.
"""

from __future__ import annotations

import base64
import binascii
import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.records import JobRecord

# Like Ray's state API: a page big enough for a terminal, a bound that keeps
# one answer near half a megabyte (a record is about 500 bytes of JSON).
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


class Cursor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a page ended: the sort key of its last job."""

    at: float
    id: str
    v: int = 1

    @classmethod
    def after(cls, record: JobRecord) -> Cursor:
        return cls(at=record.submitted_at, id=record.job_id)

    def encode(self) -> str:
        return base64.urlsafe_b64encode(msgspec.json.encode(self)).rstrip(b"=").decode()

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor ``text`` stands for; ValueError when no gateway issued it."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            cursor = msgspec.json.decode(raw, type=cls)
        except (binascii.Error, ValueError, msgspec.DecodeError):
            cursor = None
        if cursor is None or cursor.v != 1:
            raise ValueError(
                f"cursor {text[:80]!r} was not issued by this gateway; "
                "list again without a cursor to start from the first job"
            )
        return cursor


@dataclass(frozen=True)
class JobQuery:
    """One page's request: the filters (None: any), the limit and where to start."""

    phase: str | None = None
    tenant: str | None = None
    limit: int = DEFAULT_LIMIT
    after: Cursor | None = None


def _key(record: JobRecord) -> tuple[float, str]:
    return (record.submitted_at, record.job_id)


def select(
    records: Iterable[JobRecord], query: JobQuery
) -> tuple[list[JobRecord], int, str | None]:
    """The page's records, how many match the filters in all, and the cursor
    of the next page (None on the last page)."""
    matching = sorted(
        (
            r
            for r in records
            if (query.phase is None or r.phase == query.phase)
            and (query.tenant is None or r.spec.tenant == query.tenant)
        ),
        key=_key,
    )
    start = 0
    if query.after is not None:
        start = bisect.bisect_right(matching, (query.after.at, query.after.id), key=_key)
    page = matching[start : start + query.limit]
    more = start + query.limit < len(matching)
    return page, len(matching), Cursor.after(page[-1]).encode() if more else None


def page_schema(record_ref: str) -> dict[str, Any]:
    """The OpenAPI schema of a page, its jobs being ``record_ref`` plus ``job_id``."""
    job = {"allOf": [{"$ref": record_ref},
                     {"type": "object", "required": ["job_id"],
                      "properties": {"job_id": {"type": "string"}}}]}
    return {
        "title": "JobPage",
        "type": "object",
        "required": ["jobs", "count", "total", "next_cursor"],
        "properties": {
            "jobs": {"type": "array", "items": job,
                     "description": "oldest submission first, ties by job id"},
            "count": {"type": "integer", "description": "jobs on this page"},
            "total": {"type": "integer", "description": "jobs matching the filters, all pages"},
            "next_cursor": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "pass as `cursor` for the next page; null on the last page",
            },
        },
    }
