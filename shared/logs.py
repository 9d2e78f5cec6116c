"""Job logs on the wire: what an executor ships of each rank's output, the
flood cap, and the reading options of ``GET /jobs/{id}/logs`` (pure).

An executor tails each rank's log file (``<run-dir>/<job>/logs/<server>-
rank<k>.log``) and publishes what it read as :class:`LogChunk` messages on
``hops.v1.logs.<server>.<job key>`` (stream ``HOPS_LOGS``, docs/logs.md):
many lines per message, so a chatty job is few messages. A job that writes
faster than its cap (:class:`FloodCap`, a token bucket in bytes) loses the
lines past it, and a marker line in its own log says how many bytes went.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import msgspec

# A line longer than this is cut (the rest of it is dropped, not shipped).
MAX_LINE_BYTES = 4096
# A chunk holds at most this many bytes of text (well under a NATS message).
CHUNK_BYTES = 16 * 1024
# The executor ships what a rank wrote at least this often.
FLUSH_S = 0.5
# Each job's cap on one server (all its ranks together): a steady rate and
# a burst, in bytes of text. One definition; docs/logs.md states them.
CAP_RATE_BYTES_S = 64 * 1024
CAP_BURST_BYTES = 1024 * 1024
# While a job is capped, one marker line at most this often.
MARKER_EVERY_S = 10.0
MARKER_PREFIX = "[hops] output capped:"


class LogLine(msgspec.Struct, frozen=True):
    """One line of a rank's output: when the executor read it, and its text
    (without the newline; decoded as UTF-8, bad bytes replaced)."""

    at: float
    text: str


class LogChunk(msgspec.Struct, frozen=True, kw_only=True):
    """Lines of one rank of one job on one server, in order. ``offset`` is
    the byte offset in the rank's log file of the first line (a reader can
    tell a repeat after an executor restart); ``capped`` marks a chunk that
    is the cap's marker line."""

    job_id: str
    server_id: str
    rank: int
    offset: int
    lines: list[LogLine]
    capped: bool = False


_CHUNK = msgspec.json.Decoder(LogChunk)


def decode_chunk(data: bytes) -> LogChunk:
    """A :class:`LogChunk` (``msgspec.ValidationError``/``DecodeError`` if not one)."""
    return _CHUNK.decode(data)


def encode_chunk(chunk: LogChunk) -> bytes:
    return msgspec.json.encode(chunk)


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of ``data`` (without their newline) and the rest,
    an unfinished line. A rest longer than :data:`MAX_LINE_BYTES` is a line
    too (cut there): a job that never ends a line cannot stall its log."""
    *lines, rest = data.split(b"\n")
    if len(rest) > MAX_LINE_BYTES:
        lines.append(rest)
        rest = b""
    return lines, rest


def line_text(raw: bytes) -> str:
    """A raw line as text: cut to :data:`MAX_LINE_BYTES`, ``\\r`` dropped."""
    return raw[:MAX_LINE_BYTES].rstrip(b"\r").decode("utf-8", errors="replace")


def batches(lines: Iterable[LogLine], limit: int = CHUNK_BYTES) -> Iterator[list[LogLine]]:
    """``lines`` in order, in groups whose text is at most ``limit`` bytes
    (a group has at least one line)."""
    group: list[LogLine] = []
    size = 0
    for line in lines:
        n = len(line.text.encode()) + 1
        if group and size + n > limit:
            yield group
            group, size = [], 0
        group.append(line)
        size += n
    if group:
        yield group


class FloodCap:
    """A token bucket in bytes: ``rate`` per second, at most ``burst`` saved.
    :meth:`take` lets a line through while it fits; every byte refused is
    counted in ``dropped`` until :meth:`marker` reports it. Time is given,
    never read, so the arithmetic is testable."""

    def __init__(self, rate: float = CAP_RATE_BYTES_S, burst: float = CAP_BURST_BYTES,
                 now: float = 0.0) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("a log cap needs a positive rate and burst")
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now
        self.dropped = 0
        self.dropped_total = 0
        self.marked_at = -MARKER_EVERY_S

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, size: int, now: float) -> bool:
        """Whether a line of ``size`` bytes may go now (then it is paid for)."""
        self._refill(now)
        if size <= self.tokens:
            self.tokens -= size
            return True
        self.dropped += size
        self.dropped_total += size
        return False

    def skip(self, size: int) -> None:
        """``size`` bytes were skipped unread: dropped, as past the cap."""
        self.dropped += size
        self.dropped_total += size

    def marker(self, now: float, force: bool = False) -> str | None:
        """The marker line owed now: bytes were dropped since the last one,
        and it is :data:`MARKER_EVERY_S` since then (or ``force``)."""
        if not self.dropped or (not force and now - self.marked_at < MARKER_EVERY_S):
            return None
        text = (f"{MARKER_PREFIX} {self.dropped} bytes dropped (cap {int(self.rate)} bytes/s, "
                f"burst {int(self.burst)} bytes; {self.dropped_total} dropped in all)")
        self.dropped = 0
        self.marked_at = now
        return text


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# A number this large is a time (seconds since the epoch), not a duration.
_EPOCH_FROM = 1e9


def parse_since(text: str, now: float) -> float:
    """``since`` as seconds since the epoch: a time (``1767225600``) or a
    duration back from ``now`` (``90``, ``10m``, ``2h``, ``1d``);
    :class:`ValueError` with the reason otherwise."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"since {text!r} is neither a time (seconds since the epoch) "
                         "nor a duration like 30s, 10m, 2h or 1d")
    value, unit = float(m.group(1)), m.group(2)
    if not unit and value >= _EPOCH_FROM:
        return value
    return now - value * _UNIT_S[unit]


class LogEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One line as ``GET /jobs/{id}/logs`` answers it (one JSON object a line)."""

    at: float
    server: str
    rank: int
    text: str
    capped: bool = False


def entries(chunk: LogChunk, since: float = 0.0, rank: int | None = None) -> list[LogEntry]:
    """The lines of ``chunk`` from ``since`` on, of ``rank`` if one is named."""
    if rank is not None and chunk.rank != rank and not chunk.capped:
        return []
    return [LogEntry(at=line.at, server=chunk.server_id, rank=chunk.rank, text=line.text,
                     capped=chunk.capped)
            for line in chunk.lines if line.at >= since]
