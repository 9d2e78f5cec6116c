"""``GET /jobs/{id}/logs``: a job's output, as its executors shipped it to
stream ``HOPS_LOGS`` (docs/logs.md), one JSON object a line
(``application/x-ndjson``): ``{"at", "server", "rank", "text"}``, and
``"capped": true`` on the cap's marker lines. Access is ``GET /jobs/{id}``'s
(:func:`gateway.explain_routes.visible_job`): a tenant reads only its own
jobs' logs, another tenant's job is a 404 as a missing one. The logs of a
finished job are read as those of a running one, within the stream's bounds.

With ``follow=true`` the answer goes on with each new line, and ends once
the job is in a final phase and no line came for :data:`DRAIN_S` (its
executors ship what is left within a second), or when the client leaves.
Registered by :func:`gateway.app.create_app` (:func:`log_routes`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Annotated

import msgspec
from fastapi import FastAPI, Query, Request
from fastapi.responses import Response, StreamingResponse

from gateway import views
from gateway.auth import Caller
from gateway.explain_routes import ONE_JOB_REFUSALS, TenantParam, visible_job
from gateway.logs import LogReader
from gateway.responses import bus_of, failure
from shared.events import INVALID
from shared.logs import LogChunk, LogEntry, entries, parse_since

NDJSON = "application/x-ndjson"
# Following: how often the job's phase is read, and how long a job in a
# final phase may stay silent before its log is taken as drained.
PHASE_EVERY_S = 1.0
DRAIN_S = 3.0
_ENCODER = msgspec.json.Encoder()


def _lines(chunks: Iterable[LogChunk], since: float, rank: int | None) -> list[LogEntry]:
    return [e for c in chunks for e in entries(c, since, rank)]


def _ndjson(lines: Iterable[LogEntry]) -> bytes:
    return b"".join(_ENCODER.encode(line) + b"\n" for line in lines)


async def _follow(request: Request, reader: LogReader, key: str, since: float,
                  rank: int | None) -> AsyncIterator[bytes]:
    """New lines as they come, until the job is over and drained."""
    bus = bus_of(request)
    checked = 0.0
    quiet_since: float | None = None  # when the job was first seen over
    while True:
        chunk = await reader.next(PHASE_EVERY_S)
        now = time.monotonic()
        if chunk is not None:
            data = _ndjson(entries(chunk, since, rank))
            if data:
                yield data
            if quiet_since is not None:
                quiet_since = now
        if await request.is_disconnected():
            return
        if quiet_since is None and now - checked >= PHASE_EVERY_S:
            checked = now
            record = await bus.job(key)
            if record is None or record.final:
                quiet_since = now
        if quiet_since is not None and chunk is None and now - quiet_since >= DRAIN_S:
            return


def log_routes(app: FastAPI) -> None:
    @app.get("/jobs/{job_id}/logs", summary="One job's output, one JSON object a line",
             description="Each rank's stdout and stderr as the executors shipped it (stream "
             "`HOPS_LOGS`, kept after the job ends within its bounds: docs/logs.md), as "
             "`application/x-ndjson`: `{at, server, rank, text}` a line, `capped: true` on "
             "the flood cap's marker lines. `follow=true` streams new lines until the job "
             "has ended and its output is drained.",
             response_class=StreamingResponse, response_model=None,
             responses={200: {"description": "the lines", "content": {NDJSON: {}}},
                        400: {"description": "a `since` that is no time or duration"},
                        **ONE_JOB_REFUSALS})
    async def job_logs(request: Request, job_id: str, principal: Caller,
                       tenant: TenantParam = None,
                       rank: Annotated[int | None, Query(ge=0, description="this local rank "
                                                         "only")] = None,
                       since: Annotated[str | None, Query(description="seconds since the "
                                                          "epoch, or a duration back from "
                                                          "now: 90, 10m, 2h, 1d")] = None,
                       tail: Annotated[int | None, Query(ge=0, description="the last N lines "
                                                         "only")] = None,
                       follow: Annotated[bool, Query(description="go on with new lines "
                                                     "until the job ends")] = False,
                       ) -> Response:
        try:
            start = parse_since(since, time.time()) if since else 0.0
        except ValueError as e:
            return failure(400, INVALID, str(e))
        key, record = await visible_job(request, principal, job_id, tenant)
        if record is None:
            return failure(404, views.NOT_FOUND, f"no job {job_id!r}")
        bus = bus_of(request)
        reader = LogReader(bus.js, key, start, bus.log)
        await reader.__aenter__()

        async def body() -> AsyncIterator[bytes]:
            try:
                stored = _lines(await reader.backlog(), start, rank)
                if tail is not None:
                    stored = list(deque(stored, maxlen=tail))
                if stored:
                    yield _ndjson(stored)
                if follow:
                    async for data in _follow(request, reader, key, start, rank):
                        yield data
            finally:
                await reader.__aexit__(None, None, None)

        return StreamingResponse(body(), media_type=NDJSON)
