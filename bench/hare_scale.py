"""Hare's task scheduler at scale (hare.md §5.2, Algorithm 1): the relaxation
and the greedy timed separately on a synthetic problem of about 10^4
macro-tasks (the target is 60 s in all).

The problem: JOBS jobs with 10^4-10^6 rounds of 1-8 tasks each, arriving over
an hour, on 160 GPUs (k80, p100, v100); a fifth of the jobs cannot run on a
k80. The jobs are grouped into macro-tasks (scheduling/policies/hare/macro.py)
with a budget of 10^4 before scheduling.

    .venv/bin/python bench/hare_scale.py [--jobs 300] [--gpus 160] [--budget 10000] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduling.policies.hare.checks import check_schedule, weighted_completion
from scheduling.policies.hare.greedy import PLACEMENTS, greedy
from scheduling.policies.hare.macro import macro_problem
from scheduling.policies.hare.model import Gpu, GpuId, TaskJob, TaskProblem, TaskSchedule
from scheduling.policies.hare.relax import relax
from shared.ids import GpuType, JobId

# Seconds per batch relative to a V100 (k80 slowest).
SLOWDOWN = {GpuType("v100"): 1.0, GpuType("p100"): 1.6, GpuType("k80"): 3.2}
GPU_SHARE = {GpuType("k80"): 0.4, GpuType("p100"): 0.3, GpuType("v100"): 0.3}


def make_problem(rng: random.Random, n_jobs: int, n_gpus: int) -> TaskProblem:
    gpus: list[Gpu] = []
    for t, share in GPU_SHARE.items():
        count = round(share * n_gpus) if t != GpuType("v100") else n_gpus - len(gpus)
        gpus += [Gpu(GpuId(f"{t}-{k:03d}"), t) for k in range(count)]
    jobs = []
    for n in range(n_jobs):
        batch = rng.uniform(0.05, 0.5)
        types = [t for t in SLOWDOWN if t != GpuType("k80") or rng.random() > 0.2]
        jobs.append(TaskJob(
            id=JobId(f"job{n:04d}"),
            arrival_s=rng.uniform(0.0, 3600.0),
            rounds=int(10 ** rng.uniform(4, 6)),
            tasks_per_round=rng.choice((1, 1, 2, 2, 4, 4, 8)),
            compute_s={t: batch * SLOWDOWN[t] * rng.uniform(0.9, 1.1) for t in types},
            sync_s={t: batch * rng.uniform(0.05, 0.2) for t in types},
            weight=rng.choice((1.0, 1.0, 2.0)),
        ))
    return TaskProblem(jobs=tuple(jobs), gpus=tuple(gpus))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--gpus", type=int, default=160)
    parser.add_argument("--budget", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    problem, macros = macro_problem(
        make_problem(random.Random(args.seed), args.jobs, args.gpus), args.budget
    )
    tasks = sum(j.remaining_rounds * j.tasks_per_round for j in problem.jobs)
    real = sum(m.real_rounds * m.job.tasks_per_round for m in macros)
    print(f"jobs {len(problem.jobs)}  GPUs {len(problem.gpus)}  real tasks {real}  "
          f"macro-tasks {tasks}  K max {max(m.k for m in macros)}")
    t0 = time.perf_counter()
    relaxed = relax(problem)
    lp_s = time.perf_counter() - t0
    print(f"LP       {lp_s:8.2f} s   bound Σ w C = {relaxed.objective:.6g}")
    for placement in PLACEMENTS:
        t0 = time.perf_counter()
        placed = greedy(problem, relaxed.starts, placement)
        greedy_s = time.perf_counter() - t0
        schedule = TaskSchedule(placed, relaxed.objective)
        check_schedule(problem, schedule)
        value = weighted_completion(problem, schedule)
        print(f"greedy   {greedy_s:8.2f} s   {placement:15s} Σ w C = {value:.6g} "
              f"({value / relaxed.objective:.3f} × bound)   total {lp_s + greedy_s:.2f} s")


if __name__ == "__main__":
    main()
