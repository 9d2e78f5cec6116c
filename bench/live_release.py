"""Release after a job dies, and the latency of a planning round, live
(``bench/live_submit.py --kills K --round-jobs N``).

When the rest of the live system can run, a second stack (every component,
a two-server EMULATED cluster) measures how long after an emulated job's
process is SIGKILLed its GPUs are free (its ``hops_alloc`` entry deleted)
and ``resources_released`` is published, and
the latency of a planning round that starts jobs: from the round's start
(``plan_issued.at``: the leader begins its snapshot) to the plan on the wire
(snapshot, estimates, solve, publish), and to the last ``job_started`` of
the jobs it starts (the placer booked them and every executor acknowledged,
which includes starting the emulated job processes).

It stands apart from the submission measurements of
:mod:`bench.live_submit`, which need only the scheduler and the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.live_stack import auth_headers, client_settings, config_in, spec, start_stack
from cli.up.launcher import port_free
from cli.up.stack import components
from executor.procs import emulated_job_pids
from services.runtime.bus import connect
from shared import events as ev
from shared import subjects
from shared.events import SubmitJob, decode_plan_event, encode

CLUSTER = """\
name: bench-two-servers
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""


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

    await nc.subscribe(subjects.RELEASED, cb=on_released)
    await nc.subscribe(f"$KV.{subjects.KV_ALLOC}.>", cb=on_alloc)
    await asyncio.sleep(0)  # nats-py: let the SUBs go out before the flush
    await nc.flush()
    out: list[tuple[float, float | None]] = []
    try:
        async with httpx.AsyncClient(base_url=gateway, timeout=10, headers=auth_headers()) as http:
            for k in range(kills):
                took = await kill_one(http, f"victim-{k}", freed, released)
                if took is not None:
                    out.append(took)
    finally:
        await nc.close()
    return out


def _after(seen: dict[str, list[float]], job_id: str, t0: float) -> float | None:
    return next((t for t in seen.get(job_id, []) if t > t0), None)


async def kill_one(http: httpx.AsyncClient, job_id: str, freed: dict[str, list[float]],
                   released: dict[str, list[float]]) -> tuple[float, float | None] | None:
    """Submit ``job_id``, SIGKILL its processes once it runs; seconds until
    ``freed`` and ``released`` note it (None: no placement deleted in 30 s)."""
    await http.post("/jobs", content=encode(SubmitJob(spec=spec(job_id))))
    pids = await until_running(http, job_id)
    t0 = time.perf_counter()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _after(freed, job_id, t0) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    t1 = _after(freed, job_id, t0)
    if t1 is None:
        return None
    deadline = time.monotonic() + 2
    while _after(released, job_id, t0) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    t2 = _after(released, job_id, t0)
    return t1 - t0, None if t2 is None else t2 - t0


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
