"""``hops experiment coda``: CPU cores as a scheduled resource (issue 21;
CODA, Zhao et al. ICDCS'20, §VI).

A cluster shaped like the paper's (80 servers of 5 GTX 1080Ti GPUs and 28
cores), an ElasticFlow trace's GPU jobs with their owners' core requests
and CODA's CPU jobs beside them (:mod:`experiments.coda.workload`), run under
``coda``, ``drf``, ``fifo`` and ``fixed-cores`` around the same inner GPU
policy. Writes ``results.json`` ({policy: {"gpu_util",
"idle_gpus_for_cores", "cpu_wait_p95_h", "gpu_jct_avg_h", "cpu_jct_avg_h",
...}}), ``results.md`` with the paper's numbers beside, and plots.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from experiments.coda.metrics import PAPER, coda_metrics, table
from experiments.coda.workload import CpuMix, add_cpu_jobs, with_core_requests
from experiments.common.pool import HERE, Pool, run_all
from scheduling.registry import DEFAULT_INNER, make_policy
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, ServerId
from simulator.engine import Progress, Simulation
from simulator.metrics import SimResult
from simulator.settings import SimSettings
from simulator.workloads import SimJob, load_elasticflow, packaged_trace
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.cpu_scaling import category_of
from world.truth import GroundTruth

POLICIES = ("coda", "drf", "fifo", "fixed-cores")
GPU = GpuType("GTX1080Ti")


MEMORY_GBPS = 128.0


def coda_cluster(servers: int = 80, gpus: int = 5, cores: int = 28,
                 mba: bool = False) -> Cluster:
    """The paper's cluster (§III-A, §VI-A): 80 servers of 5 GTX 1080Ti and
    two 14-core Xeon Gold 6132 sockets; the GPU type's bandwidths are the
    built-in paper-sim cluster's. Memory bandwidth: one socket's six
    DDR4-2666 channels, 128 GB/s (an assumption: a job's cores and memory
    sit on one socket). By default no MBA, the paper's fallback (halving
    cores); ``mba``: every server has it."""
    template = builtin_cluster("paper-sim-512")
    spec: GpuTypeSpec = next(t for t in template.gpu_types if t.name == GPU)
    return Cluster(gpu_types=(spec,), name="coda", servers=tuple(
        Server(ServerId(f"node-{i:02d}"), GPU, gpus, cores=cores,
               memory_bandwidth_gbps=MEMORY_GBPS, mba=mba) for i in range(servers)))


def workload(trace: str, cluster: Cluster, truth: GroundTruth, seed: int,
             first_n: int | None, compress: float) -> list[SimJob]:
    path = packaged_trace(trace) or Path(trace)
    gpu_jobs = load_elasticflow(path, truth, cluster, GPU, first_n=first_n, compress=compress)
    categories = {j.model: category_of(j.model) for j in gpu_jobs}
    return add_cpu_jobs(with_core_requests(gpu_jobs, seed, categories), seed, CpuMix())


def with_inner(name: str, inner: str) -> str:
    """The core policy spec ``name`` (settings allowed) around ``inner``."""
    return f"{name}{',' if ':' in name else ':'}inner={inner}"


def simulate_one(name: str, inner: str, trace: str, first_n: int | None, compress: float,
                 seed: int, mba: bool = False, progress: Progress | None = None) -> SimResult:
    """One policy's run (a worker process's whole task)."""
    cluster = coda_cluster(mba=mba)
    truth = GroundTruth(cluster, builtin_catalog())
    jobs = workload(trace, cluster, truth, seed, first_n, compress)
    policy = make_policy(with_inner(name, inner))
    sim = Simulation(cluster, jobs, policy, truth, SimSettings(seed=seed),
                     timer=time.perf_counter)
    return sim.run(progress)


def run(out: Path, inner: str = DEFAULT_INNER, trace: str = "elasticflow-cluster04",
        first_n: int | None = 400, compress: float = 1.0, seed: int = 0,
        policies: Sequence[str] = POLICIES, progress: Progress | None = None,
        pool: Pool = HERE, mba: bool = False) -> dict[str, dict[str, float]]:
    """Every policy on one workload (a parallel ``pool``: all at once); the
    results, written under ``out``. What produced them (the commit, the
    solver's version) is ``setup.json``'s ``provenance``: ``results.json``
    keeps its {policy: {metric: value}} shape."""
    from experiments.common.provenance import provenance

    for name in policies:
        make_policy(with_inner(name, inner))  # a bad spec fails before the first run
    cluster = coda_cluster(mba=mba)
    truth = GroundTruth(cluster, builtin_catalog())
    jobs = workload(trace, cluster, truth, seed, first_n, compress)
    args = (inner, trace, first_n, compress, seed, mba)
    runs = run_all(pool, simulate_one, {n: (n, *args) for n in policies},
                   here=functools.partial(simulate_one, progress=progress))
    results = {n: coda_metrics(r, cluster) for n, r in runs.items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    setup = {"inner": inner, "trace": trace, "first_n": first_n, "compress": compress,
             "seed": seed, "mba": mba, "jobs": len(jobs),
             "cpu_jobs": sum(1 for j in jobs if j.spec.kind == "cpu"),
             "cluster": msgspec.to_builtins(cluster)}
    recorded = {**setup, "provenance": provenance()}
    (out / "setup.json").write_text(json.dumps(recorded, indent=2) + "\n")
    (out / "results.md").write_text(table(results, PAPER, setup))
    _plots(out, runs)
    return results


def _plots(out: Path, runs: dict[str, SimResult]) -> None:
    """CDFs of the CPU jobs' waits and of the GPU jobs' JCTs (Figure 11)."""
    from experiments.common.plots import cdf_plot

    cpu = {n: [j.wait_s / 60 for j in r.jobs if j.kind == "cpu"] for n, r in runs.items()}
    gpu = {n: [j.jct_s / 3600 for j in r.jobs if j.kind != "cpu" and j.jct_s is not None]
           for n, r in runs.items()}
    cdf_plot(cpu, "CPU jobs' wait (min)", out / "cpu_wait_cdf.png")
    cdf_plot(gpu, "GPU jobs' JCT (h)", out / "gpu_jct_cdf.png")
