"""Ships each job's output to stream ``HOPS_LOGS`` (docs/logs.md).

Every rank of a job writes its stdout and stderr to
``<run-dir>/<job>/logs/<server>-rank<k>.log`` (:mod:`executor.launch`;
emulated jobs write a few lines there too). The shipper tails those files
of the jobs it follows, every :data:`shared.logs.FLUSH_S`, and publishes
what is new as :class:`shared.logs.LogChunk` messages on
``hops.v1.logs.<server>.<job key>``, each with the stream's ack. A publish
that fails is kept and tried again on the next pass, before anything new is
read (the message id, ``<server>:<job>:<rank>:<offset>``, makes a retry
that got through count once); what was acknowledged is remembered next to
the log (``.<file>.shipped``), so an executor that restarts ships on from
there.

The flood cap (:class:`shared.logs.FloodCap`, one per job) only decides
what is shipped: the job's processes write to their files regardless, so a
flooding job slows neither itself, nor other jobs, nor the executor. What
is past the cap is skipped unread when the backlog is large, and the log
gets a marker line saying how many bytes were dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nats.js import JetStreamContext
from structlog.typing import FilteringBoundLogger

from executor.launch import job_paths
from shared import subjects
from shared.ids import ServerId
from shared.logs import (
    CAP_BURST_BYTES,
    CAP_RATE_BYTES_S,
    FLUSH_S,
    FloodCap,
    LogChunk,
    LogLine,
    batches,
    encode_chunk,
    line_text,
    split_lines,
)

# Read at most READS_PER_PASS times this much of one file in one pass; a
# backlog beyond SKIP_BYTES (a flood far past the cap) is skipped unread,
# as dropped.
READ_BYTES = 256 * 1024
SKIP_BYTES = 4 * 1024 * 1024
READS_PER_PASS = 8
PUBLISH_TIMEOUT_S = 2.0


@dataclass
class RankTail:
    """One rank's log file: how far it was read, the unfinished line, and
    the chunks read but not yet acknowledged."""

    path: Path
    rank: int
    offset: int = 0  # where the next read starts
    rest: bytes = b""
    pending: list[LogChunk] = field(default_factory=list)
    saved: int = -1

    @property
    def mark(self) -> Path:
        return self.path.with_name(f".{self.path.name}.shipped")

    def load(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.offset = self.saved = int(self.mark.read_text().strip())

    def save(self, offset: int) -> None:
        if offset == self.saved:
            return
        with contextlib.suppress(OSError):
            self.mark.write_text(f"{offset}\n")
            self.saved = offset


@dataclass
class JobLogs:
    job_id: str
    logs: Path
    cap: FloodCap
    tails: dict[Path, RankTail] = field(default_factory=dict)
    ending: bool = False
    # A marker not yet acknowledged, with its message id: published again,
    # unchanged, on the next pass (its count of dropped bytes is not kept
    # anywhere else once the cap has handed it out).
    marker: tuple[LogChunk, str] | None = None


_RANK = re.compile(r"-rank(\d+)\.log$")


class LogShipper:
    """Follows the jobs of one server and ships their output (see the module)."""

    def __init__(self, js: JetStreamContext, server_id: ServerId, run_dir: Path,
                 log: FilteringBoundLogger, rate: float = CAP_RATE_BYTES_S,
                 burst: float = CAP_BURST_BYTES, clock: Callable[[], float] = time.time) -> None:
        self.js = js
        self.server_id = server_id
        self.run_dir = run_dir
        self.log = log
        self.rate, self.burst = rate, burst
        self.clock = clock
        self.jobs: dict[str, JobLogs] = {}
        # One pass at a time: the executor's shutdown ships the rest while the
        # loop's own last pass may still be publishing the same pending chunks.
        self._passing = asyncio.Lock()

    def follow(self, job_id: str) -> None:
        """Ship ``job_id``'s output from now on (again: a restart of it)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.ending = False
            return
        logs = job_paths(self.run_dir, job_id, self.server_id).logs
        self.jobs[job_id] = JobLogs(job_id, logs, FloodCap(self.rate, self.burst, self.clock()))

    def finish(self, job_id: str) -> None:
        """The job's processes here ended: ship the rest, then stop following."""
        if job_id in self.jobs:
            self.jobs[job_id].ending = True

    async def run(self, stopping: asyncio.Event) -> None:
        """Ship every :data:`FLUSH_S` until ``stopping``, then once more."""
        while not stopping.is_set():
            await self.ship_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), FLUSH_S)
        await self.ship_all()

    async def ship_all(self) -> None:
        async with self._passing:
            await self._ship_all()

    async def _ship_all(self) -> None:
        for job in list(self.jobs.values()):
            ending = job.ending
            try:
                drained = await self._ship_job(job, final=ending)
            except Exception as e:  # one job's trouble is never the executor's
                self.log.warning("job output not shipped", job_id=job.job_id, error=repr(e))
                continue
            if ending and drained and self.jobs.get(job.job_id) is job and job.ending:
                del self.jobs[job.job_id]

    async def _ship_job(self, job: JobLogs, final: bool) -> bool:
        """One pass over the job's files; whether everything was acknowledged."""
        self._discover(job)
        drained = True
        for tail in job.tails.values():
            drained &= await self._ship_rank(job, tail, final)
        if job.marker is None and (text := job.cap.marker(self.clock(), force=final)):
            chunk = LogChunk(job_id=job.job_id, server_id=self.server_id, rank=-1,
                             offset=0, lines=[LogLine(self.clock(), text)], capped=True)
            job.marker = (chunk, f"cap:{self.clock()!r}")
        if job.marker is not None:
            if await self._publish(*job.marker):
                job.marker = None
            else:
                drained = False
        return drained

    def _discover(self, job: JobLogs) -> None:
        with contextlib.suppress(OSError):
            for path in job.logs.glob(f"{self.server_id}-rank*.log"):
                m = _RANK.search(path.name)
                if m is not None and path not in job.tails:
                    tail = RankTail(path, int(m.group(1)))
                    tail.load()
                    job.tails[path] = tail

    async def _ship_rank(self, job: JobLogs, tail: RankTail, final: bool) -> bool:
        """Ship what is new of one rank (up to READS_PER_PASS reads); whether
        it is all shipped: acknowledged, and the file read to its end."""
        for _ in range(READS_PER_PASS):
            if not await self._flush(tail):  # what failed before goes first, in order
                return False
            start = tail.offset - len(tail.rest)
            data, at_end = self._read(job, tail)
            lines, tail.rest = split_lines(tail.rest + data)
            if final and at_end and tail.rest:  # the job is over: its last line will not end
                lines, tail.rest = [*lines, tail.rest], b""
            tail.pending.extend(self._chunks(job, tail, lines, start))
            if at_end:
                return await self._flush(tail)
        await self._flush(tail)
        return False  # more to read: the next pass goes on

    async def _flush(self, tail: RankTail) -> bool:
        """Publish the rank's pending chunks in order; remember how far the
        acknowledged ones reach. Whether none is left."""
        while tail.pending:
            chunk = tail.pending[0]
            if not await self._publish(chunk, f"{chunk.rank}:{chunk.offset}"):
                return False
            tail.pending.pop(0)
            tail.save(tail.pending[0].offset if tail.pending else tail.offset - len(tail.rest))
        tail.save(tail.offset - len(tail.rest))
        return True

    def _read(self, job: JobLogs, tail: RankTail) -> tuple[bytes, bool]:
        """The next bytes of the rank's file, and whether they reach its end."""
        try:
            with tail.path.open("rb") as f:
                size = f.seek(0, 2)
                if size < tail.offset:  # truncated or replaced: start over
                    tail.offset, tail.rest = 0, b""
                if size - tail.offset > SKIP_BYTES:  # far past the cap: skip, unread
                    job.cap.skip(size - tail.offset - READ_BYTES + len(tail.rest))
                    tail.offset, tail.rest = size - READ_BYTES, b""
                    f.seek(tail.offset)
                    job.cap.skip(len(f.readline()))  # resynchronise on a line's start
                    tail.offset = f.tell()
                f.seek(tail.offset)
                data = f.read(READ_BYTES)
        except OSError:
            return b"", True
        tail.offset += len(data)
        return data, tail.offset >= size

    def _chunks(self, job: JobLogs, tail: RankTail, raw: list[bytes],
                start: int) -> list[LogChunk]:
        now = self.clock()
        kept: list[LogLine] = []
        offsets: list[int] = []
        at = start
        for line in raw:
            if job.cap.take(len(line) + 1, now):
                kept.append(LogLine(now, line_text(line)))
                offsets.append(at)
            at += len(line) + 1
        out = []
        i = 0
        for group in batches(kept):
            out.append(LogChunk(job_id=job.job_id, server_id=self.server_id, rank=tail.rank,
                                offset=offsets[i], lines=group))
            i += len(group)
        return out

    async def _publish(self, chunk: LogChunk, key: str) -> bool:
        subject = subjects.logs(self.server_id, chunk.job_id)
        headers = {"Nats-Msg-Id": f"{self.server_id}:{chunk.job_id}:{key}"}
        try:
            await self.js.publish(subject, encode_chunk(chunk), timeout=PUBLISH_TIMEOUT_S,
                                  headers=headers)
        except Exception as e:  # NATS away: kept, tried again on the next pass
            self.log.info("log chunk not acknowledged; will retry", job_id=chunk.job_id,
                          error=repr(e))
            return False
        return True
