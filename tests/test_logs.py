"""The pure parts of job logs (shared.logs): line splitting, chunking, the
flood cap's arithmetic, ``since`` parsing and the reading filters; and the
executor's shipper against a real nats-server (executor.logship): a chatty
file is few messages, nothing is lost while NATS is away, a restart ships
on from where it was, a flood is capped with a marker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from structlog.testing import capture_logs

from executor.launch import job_paths
from executor.logship import LogShipper
from services.runtime.bus import ensure_jetstream
from services.runtime.logging import get_logger
from shared import subjects
from shared.ids import ServerId
from shared.logs import (
    CHUNK_BYTES,
    MARKER_PREFIX,
    MAX_LINE_BYTES,
    FloodCap,
    LogChunk,
    LogLine,
    batches,
    decode_chunk,
    encode_chunk,
    entries,
    line_text,
    parse_since,
    split_lines,
)
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import nc

__all__ = ["nats_server", "nats_url", "nc"]  # fixtures

NOW = 1_767_225_600.0


def test_split_keeps_the_unfinished_line_and_cuts_an_endless_one() -> None:
    assert split_lines(b"a\nb\nc") == ([b"a", b"b"], b"c")
    assert split_lines(b"a\n") == ([b"a"], b"")
    long = b"x" * (MAX_LINE_BYTES + 1)
    assert split_lines(long) == ([long], b"")
    assert line_text(b"caf\xc3\xa9\r") == "café" and line_text(b"\xff") == "\ufffd"
    assert len(line_text(long)) == MAX_LINE_BYTES


@given(st.lists(st.text(max_size=3000), max_size=60), st.integers(100, 20_000))
def test_batches_keep_every_line_in_order_within_the_limit(texts: list[str], limit: int
                                                           ) -> None:
    lines = [LogLine(float(i), t) for i, t in enumerate(texts)]
    groups = list(batches(lines, limit))
    assert [x for g in groups for x in g] == lines
    for g in groups:
        assert g and (len(g) == 1 or sum(len(x.text.encode()) + 1 for x in g) <= limit)


def test_a_chunk_round_trips() -> None:
    c = LogChunk(job_id="alice/j1", server_id="s0", rank=1, offset=7,
                 lines=[LogLine(1.0, "hi")])
    assert decode_chunk(encode_chunk(c)) == c


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 5000)), max_size=200),
       st.integers(100, 10_000), st.integers(100, 50_000), st.floats(0.5, 20))
def test_the_cap_never_lets_more_than_its_budget_through(
        writes: list[tuple[float, int]], rate: int, burst: int, window: float) -> None:
    """In any window of W seconds at most burst + rate * W bytes pass, and
    every byte refused is counted."""
    cap = FloodCap(rate, burst, now=0.0)
    now, passed, offered = 0.0, [], 0
    for gap, size in writes:
        now += gap
        offered += size
        if cap.take(size, now):
            passed.append((now, size))
    assert sum(s for _, s in passed) + cap.dropped_total == offered
    for start, _ in passed:
        inside = sum(s for t, s in passed if start <= t <= start + window)
        assert inside <= burst + rate * window + 1e-6


def test_the_marker_says_what_was_dropped_and_comes_at_most_every_ten_seconds() -> None:
    cap = FloodCap(rate=100, burst=100, now=0.0)
    assert cap.take(100, 0.0) and not cap.take(50, 0.0)
    assert cap.marker(0.0) is not None and cap.marker(0.0) is None  # nothing new
    assert not cap.take(300, 1.0)
    assert cap.marker(1.0) is None  # too soon
    forced = cap.marker(1.0, force=True)  # at the job's end
    assert forced is not None and forced.startswith(MARKER_PREFIX)
    assert "300 bytes dropped" in forced and "350 dropped in all" in forced
    with pytest.raises(ValueError):
        FloodCap(rate=0)


def test_since_is_a_time_or_a_duration() -> None:
    assert parse_since("1767225000", NOW) == 1767225000.0
    assert parse_since("90", NOW) == NOW - 90
    assert parse_since("10m", NOW) == NOW - 600
    assert parse_since(" 2h ", NOW) == NOW - 7200
    assert parse_since("1.5d", NOW) == NOW - 1.5 * 86400
    for bad in ("", "yesterday", "-5m", "10w", "1e9"):
        with pytest.raises(ValueError, match="duration"):
            parse_since(bad, NOW)


def test_entries_filter_by_rank_and_time_and_keep_the_markers() -> None:
    c = LogChunk(job_id="j", server_id="s0", rank=1, offset=0,
                 lines=[LogLine(1.0, "a"), LogLine(2.0, "b")])
    marker = LogChunk(job_id="j", server_id="s0", rank=-1, offset=0,
                      lines=[LogLine(3.0, "m")], capped=True)
    assert [e.text for e in entries(c, since=1.5)] == ["b"]
    assert entries(c, rank=0) == [] and len(entries(c, rank=1)) == 2
    assert [e.capped for e in entries(marker, rank=0)] == [True]


# --- the shipper, on a real nats-server ------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def stored(nc: NATS, job: str) -> list[LogChunk]:
    js = nc.jetstream()
    out, seq = [], 1
    while True:
        try:
            msg = await js.get_msg(subjects.STREAM_LOGS.name, seq=seq,
                                   subject=subjects.logs("s0", job), next=True)
        except Exception:
            return out
        out.append(decode_chunk(msg.data or b""))
        seq = (msg.seq or seq) + 1


def shipper(nc: NATS, run_dir: Path, clock: Clock, rate: float = 1e6,
            burst: float = 1e6) -> LogShipper:
    return LogShipper(nc.jetstream(), ServerId("s0"), run_dir, get_logger(), rate, burst, clock)


async def test_a_chatty_rank_is_few_messages_and_a_restart_ships_on(
        nc: NATS, tmp_path: Path) -> None:
    await ensure_jetstream(nc.jetstream())
    log = job_paths(tmp_path, "alice/j1", ServerId("s0")).log(0)
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"step {i}\n" for i in range(2000)) + "partial")
    clock = Clock()
    first = shipper(nc, tmp_path, clock)
    first.follow("alice/j1")
    await first.ship_all()
    chunks = await stored(nc, "alice/j1")
    assert [x.text for c in chunks for x in c.lines] == [f"step {i}" for i in range(2000)]
    assert len(chunks) <= 2000 * 10 // CHUNK_BYTES + 1
    # A new executor (a restart) ships on from what was acknowledged.
    with log.open("a") as f:
        f.write(" line\nafter\n")
    second = shipper(nc, tmp_path, clock)
    second.follow("alice/j1")
    second.finish("alice/j1")
    await second.ship_all()
    texts = [x.text for c in await stored(nc, "alice/j1") for x in c.lines]
    assert texts[2000:] == ["partial line", "after"]
    assert "alice/j1" not in second.jobs  # drained: no longer followed


async def test_two_passes_at_once_ship_each_line_once(nc: NATS, tmp_path: Path) -> None:
    """The executor's shutdown ships the rest while the loop's last pass may
    still be publishing: the passes take turns (they once popped the same
    pending chunk twice: IndexError, and the job's last lines unshipped)."""
    await ensure_jetstream(nc.jetstream())
    log = job_paths(tmp_path, "j2", ServerId("s0")).log(0)
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(3000)))
    ship = shipper(nc, tmp_path, Clock())
    ship.follow("j2")
    ship.finish("j2")
    with capture_logs() as said:
        await asyncio.gather(ship.ship_all(), ship.ship_all())
    assert not [e for e in said if e["event"] == "job output not shipped"], said
    texts = [x.text for c in await stored(nc, "j2") for x in c.lines]
    assert texts == [f"line {i}" for i in range(3000)]
    assert "j2" not in ship.jobs


async def test_a_flood_is_capped_with_a_marker(nc: NATS, tmp_path: Path) -> None:
    await ensure_jetstream(nc.jetstream())
    log = job_paths(tmp_path, "f", ServerId("s0")).log(0)
    log.parent.mkdir(parents=True)
    log.write_bytes((b"y" * 99 + b"\n") * 60_000)  # 6 MB: past the skip threshold too
    clock = Clock()
    ship = shipper(nc, tmp_path, clock, rate=1000, burst=10_000)
    ship.follow("f")
    ship.finish("f")
    await ship.ship_all()
    chunks = await stored(nc, "f")
    lines = [x for c in chunks if not c.capped for x in c.lines]
    markers = [c.lines[0].text for c in chunks if c.capped]
    assert len(lines) == 100 and len(markers) == 1
    dropped = int(markers[0].split()[3])
    assert dropped + 100 * 100 == 6_000_000


async def test_a_marker_not_acknowledged_is_published_again(nc: NATS, tmp_path: Path) -> None:
    log = job_paths(tmp_path, "f", ServerId("s0")).log(0)
    log.parent.mkdir(parents=True)
    log.write_bytes((b"z" * 99 + b"\n") * 500)  # 50 kB against a 10 kB burst
    ship = shipper(nc, tmp_path, Clock(), rate=1000, burst=10_000)
    ship.follow("f")
    ship.finish("f")
    await ensure_jetstream(nc.jetstream())
    await nc.jetstream().delete_stream(subjects.STREAM_LOGS.name)  # publishes go unanswered
    await ship.ship_all()  # nothing is acknowledged: the marker is kept
    assert ship.jobs["f"].marker is not None
    await ensure_jetstream(nc.jetstream())
    await ship.ship_all()
    markers = [c.lines[0].text for c in await stored(nc, "f") if c.capped]
    assert len(markers) == 1 and int(markers[0].split()[3]) == 50_000 - 100 * 100


async def test_nothing_is_lost_while_nats_is_away(nc: NATS, tmp_path: Path) -> None:
    await ensure_jetstream(nc.jetstream())
    log = job_paths(tmp_path, "j", ServerId("s0")).log(0)
    log.parent.mkdir(parents=True)
    log.write_text("one\n")
    clock = Clock()
    ship = shipper(nc, tmp_path, clock)
    ship.follow("j")
    await nc.jetstream().delete_stream(subjects.STREAM_LOGS.name)  # publishes go unanswered
    await ship.ship_all()
    with log.open("a") as f:
        f.write("two\n")
    await ship.ship_all()
    assert ship.jobs["j"].tails[log].pending  # kept
    await ensure_jetstream(nc.jetstream())
    await ship.ship_all()
    await asyncio.sleep(0)
    assert [x.text for c in await stored(nc, "j") for x in c.lines] == ["one", "two"]
