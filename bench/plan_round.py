"""One Hops planning round (the first plan plus its fill passes, §3.6) on
synthetic clusters of 64 to 4096 GPUs with window-limited queues.

Prints, per cluster size, the median and p95 wall time of
``HopsPolicy.plan`` over the trials, the first pass's formulation, columns
and solver time, and the largest relative gap any pass ended with.

    .venv/bin/python bench/plan_round.py [TRIALS] [--sizes 64,512,1024,4096] [--gap 0.01]
        [--explain]

With ``--explain`` each timed round also computes every waiting job's
reason (:func:`scheduling.explain.with_reasons`), as the mechanism does
after each plan; ``explain_p95_s`` is that step's own p95.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic import make_cluster, make_queue
from scheduling.explain import with_reasons
from scheduling.layers.profiling_first import ProfilingFirst
from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.registry import profiling_settings
from shared.snapshot import Plan, Snapshot


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def run_size(gpus: int, trials: int, settings: HopsSettings,
             explain: bool = False) -> dict[str, object]:
    walls: list[float] = []
    explained: list[float] = []
    plans: list[Plan] = []
    jobs = window = 0
    for trial in range(trials):
        rng = random.Random(gpus * 7919 + trial)
        cluster = make_cluster(rng, gpus)
        queue, estimates = make_queue(rng, cluster)
        snap = Snapshot(now=7200.0, cluster=cluster, jobs=tuple(queue), estimates=estimates)
        policy = HopsPolicy(settings).wrapped(ProfilingFirst(profiling_settings(settings)))
        start = time.perf_counter()
        plan = policy.plan(snap)
        planned = time.perf_counter()
        if explain:
            plan = with_reasons(snap, plan, r_num=settings.r_num, sigma=settings.sigma)
        plans.append(plan)
        walls.append(time.perf_counter() - start)
        explained.append(time.perf_counter() - planned)
        jobs, window = len(queue), len(plans[-1].reasons.window)
    first = [p.reasons.passes[0] for p in plans]
    used = [sum(a.config.total_gpus for a in p.assignments) / gpus for p in plans]
    return {
        "gpus": gpus,
        "queue": jobs,
        "window": window,
        "formulation": "/".join(sorted({f.formulation for f in first})),
        "columns": int(statistics.median(f.variables for f in first)),
        "passes": max(len(p.reasons.passes) for p in plans),
        "median_s": statistics.median(walls),
        "p95_s": p95(walls),
        "solver_p95_s": p95([f.solve_s for f in first]),
        "max_gap": max(s.gap for p in plans for s in p.reasons.passes),
        "min_used": min(used),
        "explain_p95_s": p95(explained),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trials", nargs="?", type=int, default=10)
    parser.add_argument("--sizes", default="64,512,1024,4096")
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--explain", action="store_true",
                        help="time each round with its reasons (scheduling.explain)")
    args = parser.parse_args()
    settings = HopsSettings(mip_rel_gap=args.gap)
    header = ("gpus", "queue", "window", "formulation", "columns", "passes", "median_s",
              "p95_s", "solver_p95_s", "max_gap", "min_used", "explain_p95_s")
    print(" | ".join(header))
    for gpus in (int(s) for s in args.sizes.split(",")):
        row = run_size(gpus, args.trials, settings, args.explain)
        cells = (f"{row[h]:.3f}" if isinstance(row[h], float) else str(row[h]) for h in header)
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
