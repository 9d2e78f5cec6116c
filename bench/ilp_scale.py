"""Planning-pass scaling benchmark (Hops §4.7): solve time of one planning pass
on synthetic clusters of 64 to 4096 GPUs.

Each instance: 8-GPU servers in 3-5 GPU types (contiguous blocks), a queue
cut by the service window (minimum requirements accumulate to the idle GPUs),
requirement sets drawn from subsets of {1, 2, 4, 8, 16}, per-type throughput
curves with sub-linear aggregated scaling and placement sensitivity rho in
[1.0, 3.0], and lambda = 1 weights from random priorities. Variants:
``first`` (the first plan of a round: every GPU idle), ``wide`` (requirements
from {1, 2, 3, 4, 6, 8, 12, 16}, as equal steps of a range give), ``fill``
(a later plan: 0-8 idle GPUs per server).

    .venv/bin/python bench/ilp_scale.py [TRIALS] [--sizes 64,512,1024,4096]
                                        [--variant first|wide|fill] [--gap 0.01]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic import curve as _curve
from bench.synthetic import make_cluster
from scheduling.policies.hops.passes import PassJob, PassResult, SolverSettings, solve_pass
from shared.cluster import Cluster
from shared.estimate import JobEstimate, sensitivity
from shared.ids import JobId, ServerId

REQUIREMENTS = (1, 2, 4, 8, 16)
WIDE_REQUIREMENTS = (1, 2, 3, 4, 6, 8, 12, 16)
TYPE_SPEED = (1.0, 1.6, 2.3, 3.1, 4.0)


def make_jobs(
    rng: random.Random, cluster: Cluster, idle: int, sizes: tuple[int, ...] = REQUIREMENTS
) -> list[PassJob]:
    jobs: list[PassJob] = []
    acc = 0
    while acc < idle:
        jid = JobId(f"j{len(jobs):05d}")
        reqs = tuple(sorted(rng.sample(sizes, rng.choice((1, 1, 2, 2, 3, 4)))))
        base, rho = rng.uniform(50, 500), rng.uniform(1.0, 3.0)
        by_type = {
            t.name: _curve(rng, base * speed * rng.uniform(0.8, 1.2), rho * rng.uniform(0.9, 1.1))
            for t, speed in zip(cluster.gpu_types, TYPE_SPEED, strict=False)
        }
        est = JobEstimate(jid, by_type)
        rhos = {t: sensitivity(est, t) for t in by_type}
        jobs.append(PassJob(jid, rng.uniform(0.01, 1.0), reqs, rhos, est))
        acc += reqs[0]
    # The caller passes the window in descending priority.
    jobs.sort(key=lambda j: -j.weight)
    return jobs


def make_instance(
    rng: random.Random, gpus: int, variant: str
) -> tuple[Cluster, dict[ServerId, int], list[PassJob]]:
    cluster = make_cluster(rng, gpus)
    free = {s.id: s.gpus for s in cluster.servers}
    if variant == "fill":
        free = {s.id: rng.choice((0, 0, 1, 2, 3, 4, 5, 6, 7, 8)) for s in cluster.servers}
    sizes = WIDE_REQUIREMENTS if variant == "wide" else REQUIREMENTS
    return cluster, free, make_jobs(rng, cluster, sum(free.values()), sizes)


def run_size(
    gpus: int, trials: int, variant: str, settings: SolverSettings
) -> dict[str, object]:
    walls: list[float] = []
    results: list[PassResult] = []
    n_jobs: list[int] = []
    for trial in range(trials):
        cluster, free, jobs = make_instance(random.Random(gpus * 1000 + trial), gpus, variant)
        t0 = time.perf_counter()
        results.append(solve_pass(cluster, free, jobs, settings))
        walls.append(time.perf_counter() - t0)
        n_jobs.append(len(jobs))
    walls.sort()
    p95 = walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))]
    return {
        "gpus": gpus,
        "jobs": f"{min(n_jobs)}-{max(n_jobs)}",
        "formulation": "/".join(sorted({r.formulation for r in results})),
        "columns": f"{min(r.columns for r in results)}-{max(r.columns for r in results)}",
        "median_s": statistics.median(walls),
        "p95_s": p95,
        "solver_med_s": statistics.median(r.solve_s for r in results),
        "max_gap": max(r.gap for r in results),
        "status": "/".join(sorted({r.status for r in results})),
    }


def _cell(name: str, value: object) -> str:
    if isinstance(value, float):
        return f"{value:.5f}" if name == "max_gap" else f"{value:.3f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", nargs="?", type=int, default=5)
    parser.add_argument("--sizes", default="64,512,1024,4096")
    parser.add_argument("--variant", choices=("first", "wide", "fill"), default="first")
    parser.add_argument("--gap", type=float, default=0.01)
    args = parser.parse_args()
    settings = SolverSettings(mip_rel_gap=args.gap)
    header = ("gpus", "jobs", "formulation", "columns", "median_s", "p95_s", "solver_med_s",
              "max_gap", "status")
    print(" | ".join(header))
    for gpus in (int(s) for s in args.sizes.split(",")):
        row = run_size(gpus, args.trials, args.variant, settings)
        print(" | ".join(_cell(h, row[h]) for h in header), flush=True)


if __name__ == "__main__":
    main()
