"""Job submission through the live system, and release after a job dies.

Starts its own stack the way ``hops up`` does (the same commands and
environment, :mod:`cli.up.stack`): nats-server with JetStream, the scheduler
and the gateway as processes. Then measures the acknowledgement latency of
``hops.v1.jobs.submit`` (the scheduler replies once the stream has stored
``job_submitted``), p50 and p99, and the sustained submissions per second,
one at a time and with concurrent requests, through NATS and through the
REST gateway (``POST /jobs``).

When the rest of the live system can run, a second stack measures how long
after an emulated job's process is SIGKILLed its GPUs are free, and the
latency of a planning round that starts jobs (:mod:`bench.live_release`).
Both start their stack with :mod:`bench.live_stack`.

    .venv/bin/python bench/live_submit.py [--jobs 1000] [--concurrency 8,32] [--kills 3]
        [--round-jobs 6] [--no-auth]
    .venv/bin/python bench/live_submit.py --burst 500 [--long 15] [--observe 300] [--time-scale 60]
        (bench/live_burst.py)

Authentication is on, as under ``hops up``: the bench's own connections act
as ``admin`` (``HOPS_NATS_NKEY`` in its environment, which no component
inherits); ``--no-auth`` measures the same without it.

Prints a table; nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client as NATS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import live_stack
from bench.live_release import run_release
from bench.live_stack import (
    admin_token,
    client_settings,
    config_in,
    spec,
    start_stack,
    wait_admission,
)
from cli.up.stack import DEFAULT_TIME_SCALE, modules
from cli.up.up import missing_modules
from services.runtime.bus import connect
from services.runtime.logging import configure_logging
from shared import subjects
from shared.events import SubmitJob, decode_reply, encode


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def drive(
    n: int, concurrency: int, one: Callable[[int], Awaitable[bool]]
) -> dict[str, float]:
    """Run ``one(i)`` for i < n with ``concurrency`` in flight; latencies in ms."""
    latencies: list[float] = []
    ok = 0
    next_i = 0

    async def worker() -> None:
        nonlocal ok, next_i
        while next_i < n:
            i = next_i
            next_i += 1
            t0 = time.perf_counter()
            good = await one(i)
            latencies.append((time.perf_counter() - t0) * 1000)
            ok += good

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"n": n, "ok": ok, "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99),
            "rate": n / wall}


class KeepAlive:
    """A pool of plain HTTP/1.1 keep-alive connections that POST JSON.

    A general-purpose async client costs more CPU per request than the
    gateway itself, so on a small machine it would measure the client; this
    one does the least a client can."""

    def __init__(self, host: str, port: int, size: int, token: str = "") -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        self.free = asyncio.Queue()
        self.size = size

    async def open(self) -> None:
        for _ in range(self.size):
            self.free.put_nowait(await asyncio.open_connection(self.host, self.port))

    async def close(self) -> None:
        while not self.free.empty():
            _, writer = self.free.get_nowait()
            writer.close()

    async def post(self, path: str, body: bytes) -> int:
        reader, writer = await self.free.get()
        try:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.auth}Content-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body)
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            return status
        finally:
            self.free.put_nowait((reader, writer))


def submitter(
    transport: str, prefix: str, nc: NATS, http: KeepAlive
) -> Callable[[int], Awaitable[bool]]:
    """One submission of job ``<prefix><i>`` through ``transport``; True if accepted."""

    async def via_nats(i: int) -> bool:
        body = encode(SubmitJob(spec=spec(f"{prefix}{i}")))
        msg = await nc.request(subjects.JOBS_SUBMIT, body, timeout=30)
        return decode_reply(msg.data).ok

    async def via_rest(i: int) -> bool:
        body = encode(SubmitJob(spec=spec(f"{prefix}{i}")))
        return await http.post("/jobs", body) == 201

    return via_nats if transport == "nats" else via_rest


async def bench_submit(
    nats_url: str, gateway_port: int, jobs: int, concurrency: tuple[int, ...]
) -> list[str]:
    nc = await connect(client_settings(nats_url), "bench")
    rows = []
    try:
        for transport in ("nats", "rest"):
            for conc in (1, *concurrency):
                n = max(50, jobs // 10) if conc == 1 else jobs
                http = KeepAlive("127.0.0.1", gateway_port, conc, admin_token())
                await http.open()
                try:
                    r = await drive(n, conc, submitter(transport, f"{transport}-{conc}-", nc, http))
                finally:
                    await http.close()
                rows.append(f"{transport:<9} {conc:>11} {r['n']:>8.0f} {r['ok']:>6.0f} "
                            f"{r['p50']:>7.2f} {r['p99']:>7.2f} {r['rate']:>13.0f}")
    finally:
        await nc.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000,
                    help="submissions per concurrent run (0: skip the submission runs)")
    ap.add_argument("--concurrency", default="8,32",
                    help="requests in flight, comma-separated (one at a time is always run)")
    ap.add_argument("--kills", type=int, default=3, help="emulated jobs to SIGKILL (0: skip)")
    ap.add_argument("--round-jobs", type=int, default=6,
                    help="jobs started by the measured rounds (0: skip)")
    ap.add_argument("--burst", type=int, default=0,
                    help="only the burst scenario: this many submissions while long jobs run")
    ap.add_argument("--long", type=int, default=15, help="long 4-GPU jobs running in the burst")
    ap.add_argument("--observe", type=float, default=300.0,
                    help="seconds the burst is watched at least (rounds of 10 s)")
    ap.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                    help="how much faster than real time the emulated jobs run")
    ap.add_argument("--no-auth", action="store_true",
                    help="no NATS authentication (to compare with the default)")
    args = ap.parse_args()
    live_stack.AUTH = not args.no_auth
    if args.burst:
        from bench.live_burst import run_burst  # only this scenario needs it

        configure_logging("bench", "warning", stream=sys.stderr)
        run_burst(args.burst, args.long, args.observe, time_scale=args.time_scale)
        return 0
    concurrency = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    configure_logging("bench", "warning", stream=sys.stderr)
    if args.jobs:
        run_submit(args.jobs, concurrency)
    missing = missing_modules(modules())
    if (args.kills or args.round_jobs) and missing:
        print(f"release and rounds: n/a (cannot run {', '.join(missing)})")
    elif args.kills or args.round_jobs:
        run_release(args.kills, args.round_jobs)
    return 0


def run_submit(jobs: int, concurrency: tuple[int, ...]) -> None:
    print("transport concurrency requests     ok  p50 ms  p99 ms  submissions/s")
    with tempfile.TemporaryDirectory(prefix="hops-bench-") as tmp:
        config = config_in(tmp, round_s=30.0)
        nats, launcher = start_stack(config, ("scheduler", "gateway"))
        try:
            asyncio.run(wait_admission(nats.url))
            for row in asyncio.run(bench_submit(nats.url, config.gateway_port, jobs,
                                                concurrency)):
                print(row)
        finally:
            launcher.stop()
            nats.stop()




if __name__ == "__main__":
    sys.exit(main())
