"""A burst of submissions while long jobs run (``bench/live_submit.py --burst N``).

Starts every component the way ``hops up`` does (its default cluster, the
paper's physical one, EMULATED at ``--time-scale``, by default ``hops up``'s;
rounds of 10 s), starts ``--long`` long
jobs of 4 GPUs, then submits N short jobs of at most
:data:`SIGNATURES` profile signatures (models of the catalog, 0.5-5 M
samples, seeded) at 32 in flight over NATS, and polls the jobs' records and
the GPU bookings every :data:`POLL_S` seconds for at least ``--observe``
seconds and until every burst job is past profiling. It prints the figures
of :mod:`bench.burst_figures`, each with its target, and every target
missed.

Submissions keep being measured after the burst: a probe (the cancel of a
job that does not exist, which admission answers after a KV read) every
poll, so the p99 covers the whole burst, not only its first second.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections import Counter

import msgspec
from nats.aio.client import Client as NATS

from bench.burst_figures import BurstFigures
from bench.live_stack import client_settings, config_in, start_stack, wait_admission
from cli.up.stack import DEFAULT_TIME_SCALE, components
from services.runtime.bus import connect
from services.runtime.kv import read_bucket
from shared import subjects
from shared.events import CancelJob, SubmitJob, encode
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.records import JobRecord, Placement
from world.catalog import builtin_catalog
from world.clusters import cluster_arg

LONG_GPUS = 4
IN_FLIGHT = 32
POLL_S = 2.0
ROUND_S = 10.0  # the stack's rounds, wall seconds
SIGNATURES = 10
MODELS = ("resnet18-cifar10", "resnet50-cifar10", "mobilenetv2-cifar10", "densenet161-cifar10",
          "regnet-cifar10", "convnext-base-cifar10", "distilbert-imdb", "resnet18-imagenet",
          "mobilenetv2-imagenet", "regnet-imagenet")
SHAPES = ((1,), (1, 2), (2,), (1, 2, 4), (4,))


def burst_specs(n: int, seed: int = 1) -> list[JobSpec]:
    """N short jobs over :data:`SIGNATURES` models, with seeded sizes."""
    rng = random.Random(seed)
    catalog = builtin_catalog()
    out = []
    for i in range(n):
        model = MODELS[i % SIGNATURES]
        truth = catalog[model]
        out.append(JobSpec(JobId(f"burst-{i:04d}"), model, truth.batch_size, truth.params,
                           rng.randrange(500_000, 5_000_001), requirements=rng.choice(SHAPES)))
    return out


def long_spec(job_id: str) -> JobSpec:
    truth = builtin_catalog()["resnet18-imagenet"]
    return JobSpec(JobId(job_id), "resnet18-imagenet", truth.batch_size, truth.params, 10**12,
                   requirements=(LONG_GPUS,))


async def _records(nc: NATS) -> dict[str, JobRecord]:
    entries = await read_bucket(nc.jetstream(), subjects.KV_JOBS)
    return {k: msgspec.json.decode(e.data, type=JobRecord) for k, e in entries.items()}


async def _booked(nc: NATS) -> Counter[ServerId]:
    booked: Counter[ServerId] = Counter()
    for entry in (await read_bucket(nc.jetstream(), subjects.KV_ALLOC)).values():
        booked.update(msgspec.json.decode(entry.data, type=Placement).configuration.as_dict())
    return booked


async def _timed(nc: NATS, subject: str, body: bytes, into: list[float]) -> None:
    t = time.perf_counter()
    await nc.request(subject, body, timeout=30)
    into.append((time.perf_counter() - t) * 1000)


async def _submit_all(nc: NATS, specs: list[JobSpec], into: list[float]) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(spec: JobSpec) -> None:
        async with gate:
            await _timed(nc, subjects.JOBS_SUBMIT, encode(SubmitJob(spec=spec)), into)

    await asyncio.gather(*(one(s) for s in specs))


async def _start_longs(nc: NATS, longs: list[str], timeout: float) -> bool:
    for job_id in longs:
        await nc.request(subjects.JOBS_SUBMIT, encode(SubmitJob(spec=long_spec(job_id))),
                         timeout=30)
    deadline = time.monotonic() + timeout
    while any(r.phase != "running" for k, r in (await _records(nc)).items() if k in longs):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1.0)
    return True


async def burst(nats_url: str, cluster: str, n: int, long_jobs: int, observe: float,
                timeout: float) -> BurstFigures | str:
    nc = await connect(client_settings(nats_url), "bench-burst")
    servers = {s.id: (s.gpu_type, s.gpus) for s in cluster_arg(cluster).servers}
    specs = burst_specs(n)
    longs = [f"long-{i}" for i in range(long_jobs)]
    fig = BurstFigures(servers, frozenset(s.id for s in specs), frozenset(longs), round_s=ROUND_S)
    try:
        if not await _start_longs(nc, longs, timeout):
            return "burst: the long jobs never all ran"
        fig.begin(await _records(nc))
        t0 = time.monotonic()
        await _submit_all(nc, specs, fig.submit_ms)
        probe = encode(CancelJob(job_id=JobId("no-such-job")))
        while True:
            elapsed = time.monotonic() - t0
            fig.poll(elapsed, await _records(nc), await _booked(nc))
            if (fig.all_past_profiling() and elapsed >= observe) or elapsed > timeout:
                return fig
            await _timed(nc, subjects.JOBS_CANCEL, probe, fig.submit_ms)
            await asyncio.sleep(POLL_S)
    finally:
        await nc.close()


def run_burst(n: int, long_jobs: int, observe: float = 300.0, timeout: float = 900.0,
              time_scale: float = DEFAULT_TIME_SCALE) -> None:
    with tempfile.TemporaryDirectory(prefix="hops-bench-") as tmp:
        config = config_in(tmp, round_s=ROUND_S, time_scale=time_scale)
        nats, launcher = start_stack(config, tuple(c.name for c in components(config)))
        try:
            asyncio.run(wait_admission(nats.url))
            time.sleep(5.0)  # the executors register
            fig = asyncio.run(burst(nats.url, config.cluster, n, long_jobs, observe, timeout))
        finally:
            launcher.stop()
            nats.stop()
    if isinstance(fig, str):
        print(fig)
        return
    print(f"burst of {n} jobs ({SIGNATURES} signatures) with {long_jobs} long "
          f"{LONG_GPUS}-GPU jobs running, on {fig.total_gpus} GPUs, time scale {time_scale:g}:")
    for line in fig.lines():
        print(f"  {line}")
    misses = fig.misses()
    print("every target met" if not misses else "missed: " + "; ".join(misses))
