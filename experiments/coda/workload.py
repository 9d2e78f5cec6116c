"""CODA's workload (§II, §III-A, §VI-A): CPU jobs beside a GPU trace, and
the cores GPU jobs' owners ask for (pure; a seeded generator).

CODA's month-long trace is not public; what the paper says of it, and what
this module does with each number (docs/coda.md, "Workload"):

* 75% of the jobs are CPU jobs (§VI-A: 75,000 of 100,000): :func:`add_cpu_jobs`
  adds ``cpu_per_gpu_job`` (3) CPU jobs per GPU job of any GPU trace,
  arriving as a Poisson process over the GPU trace's submission period.
* Most jobs ask for one or two cores, about 15% for more than ten (§III-A:
  76.1% of jobs ask 1-2 cores, 15.3% more than 10): CPU jobs and GPU jobs'
  owners alike draw their request from :data:`CORE_REQUEST` (1-2: 76%,
  3-10: 9%, 11-16: 15%; the bounds of the two last bands are this
  project's choice).
* CPU jobs' run times are not given: log-uniform between 5 minutes and 2
  hours (this project's assumption). Their tenants are the GPU trace's
  tenants plus ``cpu_only_tenants`` that only submit CPU jobs (the paper's
  users 15-20, Figure 12).
* GPU jobs get CODA's category from their model (world.cpu_scaling) and
  no hints.
* 0.5% of CPU jobs are bandwidth-heavy (§VI-E), model ``cpu-membw``
  (simulator.contention).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from shared.ids import JobId, TenantId
from shared.job import Category, JobSpec
from simulator.workloads import SimJob

CPU_MODEL = "cpu"
HEAVY_MODEL = "cpu-membw"  # simulator.contention: a bandwidth-heavy CPU job
HEAVY_SHARE = 0.005  # §VI-E: 0.5% of CPU jobs have high bandwidth demands
# (low, high, probability): cores asked, uniformly within the band.
CORE_REQUEST: tuple[tuple[int, int, float], ...] = ((1, 2, 0.76), (3, 10, 0.09), (11, 16, 0.15))
CPU_RUN_S = (300.0, 7200.0)


class CpuMix(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The CPU jobs added to a GPU trace (defaults: the paper's mix)."""

    cpu_per_gpu_job: float = 3.0
    cpu_only_tenants: int = 6
    run_s: tuple[float, float] = CPU_RUN_S
    heavy_share: float = HEAVY_SHARE


def draw_cores(rng: np.random.Generator) -> int:
    """A core request from :data:`CORE_REQUEST`."""
    u = rng.random()
    for low, high, p in CORE_REQUEST:
        if u < p:
            return int(rng.integers(low, high + 1))
        u -= p
    low, high, _ = CORE_REQUEST[-1]
    return int(rng.integers(low, high + 1))


def with_core_requests(jobs: Sequence[SimJob], seed: int, category: dict[str, Category],
                       gpu_tenants: int = 14) -> list[SimJob]:
    """``jobs`` (GPU jobs) with their owners' core requests, CODA's category
    from the model (``category``: model -> category) and one of
    ``gpu_tenants`` owners (the paper's users 1-14, Figure 12; the traces
    name none)."""
    rng = np.random.default_rng([seed, 21])
    out = []
    for j in jobs:
        tenant = TenantId(f"user-{int(rng.integers(0, gpu_tenants)):02d}")
        spec = msgspec.structs.replace(j.spec, cores=draw_cores(rng), tenant=tenant,
                                       category=category.get(j.model, "other"))
        out.append(SimJob(spec, j.model))
    return out


def add_cpu_jobs(jobs: Sequence[SimJob], seed: int, mix: CpuMix | None = None) -> list[SimJob]:
    """``jobs`` and ``mix.cpu_per_gpu_job`` CPU jobs per GPU job, Poisson
    over the GPU jobs' submission period, in submission order."""
    mix = mix or CpuMix()
    if not jobs:
        return []
    rng = np.random.default_rng([seed, 75])
    start = min(j.spec.submit_time for j in jobs)
    end = max(j.spec.submit_time for j in jobs)
    count = round(mix.cpu_per_gpu_job * len(jobs))
    times = np.sort(rng.uniform(start, max(end, start + 1.0), size=count))
    gpu_tenants = sorted({j.spec.tenant for j in jobs})
    tenants = [*gpu_tenants, *(TenantId(f"cpu-{i}") for i in range(mix.cpu_only_tenants))]
    lo, hi = mix.run_s
    cpu = []
    for i, t in enumerate(times):
        cores = draw_cores(rng)
        run_s = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        tenant = tenants[int(rng.integers(0, len(tenants)))]
        model = HEAVY_MODEL if rng.random() < mix.heavy_share else CPU_MODEL
        spec = JobSpec(JobId(f"cpu-{i:06d}"), model, 1, 1, max(1, round(run_s * cores)),
                       tenant=tenant, submit_time=float(t), kind="cpu", cores=cores)
        cpu.append(SimJob(spec, model))
    return sorted([*jobs, *cpu], key=lambda j: (j.spec.submit_time, j.spec.id))
