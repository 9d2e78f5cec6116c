"""A burst of submissions while long jobs run (``bench/live_submit.py --burst N``).

Starts every component (the paper's physical cluster, EMULATED), starts
``--long`` long jobs of 4 GPUs, then submits N short jobs at 32 in flight
over NATS, and measures until every job of the burst has been profiled:

- seconds from the first submission until no job of the burst is still
  ``submitted`` or ``profiling``;
- GPU-seconds of running work lost: for every long job, its GPUs times the
  seconds it was stopped during the burst (an emulated job resumes from
  its exact progress, so a stop costs exactly that);
- long jobs failed, and the most GPUs profiling held per GPU type (against
  the profiling share of :mod:`scheduling.profiling`).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.live_stack import client_settings, config_in, spec, start_stack, wait_admission
from cli.up.stack import components
from scheduling.profiling import profiling_budget
from services.runtime.bus import connect
from services.runtime.kv import read_bucket
from shared import subjects
from shared.events import (
    JobFailed,
    JobResized,
    JobStarted,
    JobStopped,
    SubmitJob,
    decode_job_event,
    encode,
)
from shared.records import JobRecord, Placement
from world.clusters import cluster_arg

LONG_GPUS = 4
IN_FLIGHT = 32
PROFILING = ("submitted", "profiling")


@dataclass
class Watch:
    """What the long jobs went through, from ``HOPS_JOBS``."""

    stopped_at: dict[str, float] = field(default_factory=dict)
    lost_s: float = 0.0
    failed: set[str] = field(default_factory=set)
    reasons: Counter[str] = field(default_factory=Counter)  # of the stops

    def on_event(self, data: bytes) -> None:
        now = time.monotonic()
        match decode_job_event(data):
            case JobStopped(job_id=job_id, reason=reason):
                self.stopped_at.setdefault(job_id, now)
                self.reasons[reason or "?"] += 1
            case JobStarted(job_id=job_id) | JobResized(job_id=job_id) if job_id in self.stopped_at:
                self.lost_s += now - self.stopped_at.pop(job_id)
            case JobFailed(job_id=job_id):
                self.failed.add(job_id)
            case _:
                pass

    def close(self) -> None:
        now = time.monotonic()
        self.lost_s += sum(now - t for t in self.stopped_at.values())
        self.stopped_at.clear()


async def _records(nc: NATS) -> dict[str, JobRecord]:
    entries = await read_bucket(nc.jetstream(), subjects.KV_JOBS)
    return {k: msgspec.json.decode(e.data, type=JobRecord) for k, e in entries.items()}


async def _profiling_gpus(nc: NATS, type_of: dict[str, str]) -> Counter[str]:
    held: Counter[str] = Counter()
    for entry in (await read_bucket(nc.jetstream(), subjects.KV_ALLOC)).values():
        alloc = msgspec.json.decode(entry.data, type=Placement)
        if alloc.mode == "profile":
            for sid, g in alloc.configuration.parts:
                held[type_of[sid]] += g
    return held


async def _submit_all(nc: NATS, ids: list[str], total: int) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(job_id: str) -> None:
        async with gate:
            await nc.request(subjects.JOBS_SUBMIT, encode(SubmitJob(spec=spec(job_id, total))),
                             timeout=30)

    await asyncio.gather(*(one(j) for j in ids))


async def burst(nats_url: str, cluster: str, n: int, long_jobs: int, timeout: float) -> str:
    nc = await connect(client_settings(nats_url), "bench-burst")
    type_of = {s.id: s.gpu_type for s in cluster_arg(cluster).servers}
    caps = profiling_budget(cluster_arg(cluster), {})
    watch = Watch()

    async def on_event(msg: Msg) -> None:
        if msg.subject.rsplit(".", 1)[-1].startswith("long-"):
            watch.on_event(msg.data)

    sub = await nc.subscribe(subjects.JOB_EVENTS_ALL, cb=on_event)
    try:
        longs = [f"long-{i}" for i in range(long_jobs)]
        for job_id in longs:
            body = msgspec.structs.replace(spec(job_id), requirements=(LONG_GPUS,))
            await nc.request(subjects.JOBS_SUBMIT, encode(SubmitJob(spec=body)), timeout=30)
        deadline = time.monotonic() + timeout
        while any(r.phase != "running" for k, r in (await _records(nc)).items() if k in longs):
            if time.monotonic() > deadline:
                return "burst: the long jobs never all ran"
            await asyncio.sleep(1.0)
        watch.lost_s, watch.stopped_at, watch.reasons = 0.0, {}, Counter()
        ids = [f"burst-{i:04d}" for i in range(n)]
        t0 = time.monotonic()
        await _submit_all(nc, ids, total=10_000_000)
        most: Counter[str] = Counter()
        while True:
            records = await _records(nc)
            for t, g in (await _profiling_gpus(nc, type_of)).items():
                most[t] = max(most[t], g)
            if not any(records[j].phase in PROFILING for j in ids if j in records):
                break
            if time.monotonic() - t0 > timeout:
                return f"burst of {n}: not profiled within {timeout:.0f} s"
            await asyncio.sleep(0.5)
        took = time.monotonic() - t0
        watch.close()
    finally:
        await sub.unsubscribe()
        await nc.close()
    share = ", ".join(f"{t} {most[t]}/{caps[t]}" for t in sorted(caps))
    return (f"burst of {n} with {long_jobs} long {LONG_GPUS}-GPU jobs running: profiled in "
            f"{took:.1f} s; running work lost {watch.lost_s * LONG_GPUS:.0f} GPU-s; long jobs "
            f"failed {len(watch.failed & set(longs))}; their stops by reason "
            f"{dict(watch.reasons) or 'none'}; most profiling GPUs (of the share) {share}")


def run_burst(n: int, long_jobs: int, timeout: float = 900.0) -> None:
    with tempfile.TemporaryDirectory(prefix="hops-bench-") as tmp:
        config = config_in(tmp, round_s=10.0)
        nats, launcher = start_stack(config, tuple(c.name for c in components(config)))
        try:
            asyncio.run(wait_admission(nats.url))
            time.sleep(5.0)  # the executors register
            print(asyncio.run(burst(nats.url, config.cluster, n, long_jobs, timeout)))
        finally:
            launcher.stop()
            nats.stop()
