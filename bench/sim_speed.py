"""Wall time of whole simulations (issue targets: the 512-GPU, 500-job
comparison under 60 s per policy; all of ElasticFlow cluster04, 15,802
jobs, within 15 minutes for each of Hops, Sia and Gavel).

    .venv/bin/python bench/sim_speed.py [--policies hops,sia,gavel] [--trace] [--trace-only]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common.simrun import RunSpec, simulate
from simulator.metrics import summarize


def timed(spec: RunSpec) -> None:
    start = time.perf_counter()
    cluster, result = simulate(spec)
    wall = time.perf_counter() - start
    s = summarize(result, cluster)
    print(
        f"{spec.policy:6} {spec.workload:22} jobs {s['jobs']:6} done {s['jobs_finished']:6} "
        f"rounds {s['rounds']:5} plan p95 {s['planner_p95_s']:.3f} s  wall {wall:7.1f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--policies", default="hops,sia,gavel")
    parser.add_argument("--trace", action="store_true", help="also run ElasticFlow cluster04")
    parser.add_argument("--trace-only", action="store_true")
    args = parser.parse_args()
    if not args.trace_only:
        for policy in args.policies.split(","):
            timed(RunSpec(cluster="paper-sim-512", workload="paper-sim", policy=policy))
    if args.trace or args.trace_only:
        for policy in args.policies.split(","):
            timed(RunSpec(cluster="paper-sim-512", workload="elasticflow-cluster04",
                          policy=policy))


if __name__ == "__main__":
    main()
