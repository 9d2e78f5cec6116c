"""Job submission through the live system, and release after a job dies.

Starts its own stack the way ``hops up`` does (the same commands and
environment, :mod:`cli.up.stack`): nats-server with JetStream, the scheduler
and the gateway as processes. Then measures the acknowledgement latency of
``hops.v1.jobs.submit`` (the scheduler replies once the stream has stored
``job_submitted``), p50 and p99, and the sustained submissions per second,
one at a time and with concurrent requests, through NATS and through the
REST gateway (``POST /jobs``).

When the rest of the live system can run, a second stack (every component,
a two-server EMULATED cluster) measures how long after an emulated job's
process is SIGKILLed its GPUs are free (its ``hops_alloc`` entry deleted)
and ``resources_released`` is published, and
the latency of a planning round that starts jobs: from the round's start
(``plan_issued.at``: the leader begins its snapshot) to the plan on the wire
(snapshot, estimates, solve, publish), and to the last ``job_started`` of
the jobs it starts (the placer booked them and every executor acknowledged,
which includes starting the emulated job processes).

    .venv/bin/python bench/live_submit.py [--jobs 1000] [--concurrency 8,32] [--kills 3]
        [--round-jobs 6] [--no-auth]
    .venv/bin/python bench/live_submit.py --burst 500 [--long 8]   (bench/live_burst.py)

Authentication is on, as under ``hops up``: the bench's own connections act
as ``admin`` (``HOPS_NATS_NKEY`` in its environment, which no component
inherits); ``--no-auth`` measures the same without it.

Prints a table; nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import httpx
from nats.aio.client import Client as NATS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.up.launcher import Launcher, free_port, port_free
from cli.up.stack import StackConfig, by_name, components, modules
from cli.up.up import missing_modules, secure, stack_nats, wait_healthy
from executor.procs import emulated_job_pids
from services.runtime.bus import connect
from services.runtime.logging import configure_logging
from services.runtime.natsd import EmbeddedNats
from services.runtime.settings import RuntimeSettings, from_env
from shared import events as ev
from shared import subjects
from shared.events import SubmitJob, decode_plan_event, decode_reply, encode
from shared.ids import JobId
from shared.job import JobSpec

CLUSTER = """\
name: bench-two-servers
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""


def spec(job_id: str, total: int = 10**12) -> JobSpec:
    return JobSpec(JobId(job_id), "resnet18-cifar10", 128, 11_689_512, total, requirements=(1,))


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


async def wait_admission(nats_url: str, timeout: float = 60) -> None:
    nc = await connect(client_settings(nats_url), "bench-probe")
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                await nc.request(subjects.JOBS_SUBMIT, b"{", timeout=1)  # a malformed probe
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError("the scheduler never answered admission") from None
                await asyncio.sleep(0.2)
    finally:
        await nc.close()


def admin_token() -> str:
    """The bench's bearer token (:func:`start_stack` put it in ``HOPS_TOKEN``)."""
    return os.environ.get("HOPS_TOKEN", "")


def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token()}"} if admin_token() else {}


def client_settings(nats_url: str) -> RuntimeSettings:
    """The bench's own NATS settings: the identity :func:`start_stack` put
    in its environment."""
    return replace(from_env(), nats_servers=(nats_url,))


def start_stack(config: StackConfig, names: tuple[str, ...]) -> tuple[EmbeddedNats, Launcher]:
    nats = stack_nats(config, 0)
    creds = secure(config)
    if creds is not None:
        os.environ["HOPS_NATS_NKEY"] = str(creds.seed("admin"))
        os.environ["HOPS_TOKEN"] = creds.token("admin").read_text().strip()
    else:
        os.environ.pop("HOPS_NATS_NKEY", None)
        os.environ.pop("HOPS_TOKEN", None)
    nats.start()
    config = replace(config, nats_url=nats.url)
    launcher = Launcher(config, lambda line: print(line, file=sys.stderr))
    table = by_name(config)
    for name in names:
        launcher.start(table[name])
    wait_healthy(launcher, launcher.children[-1], timeout=90)
    return nats, launcher


async def bench_release(
    nats_url: str, gateway: str, kills: int
) -> list[tuple[float, float | None]]:
    """Per SIGKILLed running emulated job: seconds until its ``hops_alloc``
    entry is deleted (its GPUs are free) and until ``resources_released``
    (None when none came within 2 s of the deletion)."""
    nc = await connect(client_settings(nats_url), "bench-release")
    released: dict[str, list[float]] = {}  # a job is released after profiling, too
    freed: dict[str, list[float]] = {}

    async def on_released(msg: object) -> None:
        event = decode_plan_event(msg.data)  # type: ignore[attr-defined]
        released.setdefault(event.job_id, []).append(time.perf_counter())  # type: ignore[union-attr]

    async def on_alloc(msg: object) -> None:
        op = (getattr(msg, "headers", None) or {}).get("KV-Operation", "")
        if op in ("DEL", "PURGE"):
            job_id = getattr(msg, "subject", "").rsplit(".", 1)[-1]
            freed.setdefault(job_id, []).append(time.perf_counter())

    def after(seen: dict[str, list[float]], job_id: str, t0: float) -> float | None:
        return next((t for t in seen.get(job_id, []) if t > t0), None)

    await nc.subscribe(subjects.RELEASED, cb=on_released)
    await nc.subscribe(f"$KV.{subjects.KV_ALLOC}.>", cb=on_alloc)
    await asyncio.sleep(0)  # nats-py: let the SUBs go out before the flush
    await nc.flush()
    out: list[tuple[float, float | None]] = []
    try:
        async with httpx.AsyncClient(base_url=gateway, timeout=10, headers=auth_headers()) as http:
            for k in range(kills):
                job_id = f"victim-{k}"
                await http.post("/jobs", content=encode(SubmitJob(spec=spec(job_id))))
                pids = await until_running(http, job_id)
                t0 = time.perf_counter()
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while after(freed, job_id, t0) is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                t1 = after(freed, job_id, t0)
                if t1 is None:
                    continue
                deadline = time.monotonic() + 2
                while after(released, job_id, t0) is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                t2 = after(released, job_id, t0)
                out.append((t1 - t0, None if t2 is None else t2 - t0))
    finally:
        await nc.close()
    return out


async def bench_round(nats_url: str, gateway: str, n: int, timeout: float = 300) -> list[str]:
    """Submit ``n`` one-GPU jobs at once; for each plan that starts some of
    them: ms from its ``at`` to its arrival, the solver's seconds, and ms to
    the last ``job_started`` of the jobs it started."""
    nc = await connect(client_settings(nats_url), "bench-round")
    plans: list[tuple[float, ev.PlanIssued]] = []
    started: dict[str, float] = {}

    async def on_plan(msg: object) -> None:
        with contextlib.suppress(ev.WireError):
            plan = decode_plan_event(msg.data)  # type: ignore[attr-defined]
            if isinstance(plan, ev.PlanIssued):
                plans.append((time.time(), plan))

    async def on_job(msg: object) -> None:
        with contextlib.suppress(ev.WireError):
            event = ev.decode_job_event(msg.data)  # type: ignore[attr-defined]
            if isinstance(event, ev.JobStarted):
                started.setdefault(event.job_id, time.time())

    await nc.subscribe(subjects.PLANS, cb=on_plan)
    await nc.subscribe(subjects.JOB_EVENTS_ALL, cb=on_job)
    await asyncio.sleep(0)  # nats-py: let the SUBs go out before the flush
    await nc.flush()
    jobs = [f"round-{k}" for k in range(n)]
    try:
        async with httpx.AsyncClient(base_url=gateway, timeout=10, headers=auth_headers()) as http:
            for job_id in jobs:
                await http.post("/jobs", content=encode(SubmitJob(spec=spec(job_id))))
        deadline = time.monotonic() + timeout
        while not all(j in started for j in jobs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    return round_rows(plans, started, set(jobs))


def round_rows(plans: list[tuple[float, ev.PlanIssued]], started: dict[str, float],
               jobs: set[str]) -> list[str]:
    rows: list[str] = []
    first_plan_of: dict[str, tuple[float, ev.PlanIssued]] = {}
    for seen, issued in plans:  # each job counts for the first plan that assigned it
        for a in issued.plan.assignments:
            if a.job_id in jobs and a.job_id in started:
                first_plan_of.setdefault(a.job_id, (seen, issued))
    by_plan: dict[tuple[int, int, float], list[str]] = {}
    for job_id, (_, issued) in first_plan_of.items():
        by_plan.setdefault((issued.round, issued.term, issued.at), []).append(job_id)
    for (rnd, _, at), members in sorted(by_plan.items()):
        seen, issued = first_plan_of[members[0]]
        solve = sum(p.solve_s for p in issued.plan.reasons.passes)
        placed = max(started[j] for j in members) - at
        rows.append(f"round {rnd:>4} {'first' if issued.first_plan else 'fill':>5} "
                    f"{len(members):>5} {(seen - at) * 1000:>14.0f} {solve * 1000:>8.1f} "
                    f"{placed * 1000:>15.0f}")
    return rows


async def until_running(http: httpx.AsyncClient, job_id: str, timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = (await http.get(f"/jobs/{job_id}")).json()
        pids = emulated_job_pids(job_id) if record.get("phase") == "running" else []
        if pids:
            return pids
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{job_id} never ran")


AUTH = True  # --no-auth turns it off


def config_in(tmp: str, **kw: object) -> StackConfig:
    return StackConfig(data_dir=Path(tmp), gateway_port=free_port(), auth=AUTH,
                       metrics_port=free_port(), **kw)  # type: ignore[arg-type]


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
    ap.add_argument("--long", type=int, default=8, help="long 4-GPU jobs running in the burst")
    ap.add_argument("--no-auth", action="store_true",
                    help="no NATS authentication (to compare with the default)")
    args = ap.parse_args()
    global AUTH
    AUTH = not args.no_auth
    if args.burst:
        from bench.live_burst import run_burst  # it imports this module's helpers

        configure_logging("bench", "warning", stream=sys.stderr)
        run_burst(args.burst, args.long)
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


def run_release(kills: int, round_jobs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="hops-bench-") as tmp:
        cluster = Path(tmp) / "cluster.yaml"
        cluster.write_text(CLUSTER)
        config = config_in(tmp, cluster=str(cluster), time_scale=1.0, round_s=2.0)
        assert port_free(config.gateway_port)
        nats, launcher = start_stack(config, tuple(c.name for c in components(config)))
        try:
            took = asyncio.run(bench_release(nats.url, config.gateway_url, kills))
            rounds = asyncio.run(bench_round(nats.url, config.gateway_url, round_jobs)) \
                if round_jobs else []
        finally:
            launcher.stop()
            nats.stop()
    if rounds:
        print("plan             jobs  snapshot→plan ms  solve ms  →last started ms")
        print("\n".join(rounds))
    if not kills:
        return
    if not took:
        print("release after SIGKILL: no placement deleted within 30 s")
        return
    freed = [f for f, _ in took]
    events = [r for _, r in took if r is not None]
    print(f"release after SIGKILL of an emulated job: n={len(took)}/{kills}; GPUs free "
          f"(hops_alloc entry deleted) median {statistics.median(freed) * 1000:.0f} ms, "
          f"max {max(freed) * 1000:.0f} ms; resources_released for {len(events)}"
          + (f", median {statistics.median(events) * 1000:.0f} ms" if events else ""))


if __name__ == "__main__":
    sys.exit(main())
