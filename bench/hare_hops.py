"""Hare's workload run as ordinary synchronous jobs under Hops, with the
controls of docs/hare.md ("Against Hops"): each row changes one thing in how
the synchronous world runs the very jobs of ``hops experiment hare``.

    .venv/bin/python bench/hare_hops.py [--jobs 100] [--seed 0]

Rows: Hops as the experiment runs it (Gavel's measured multi-GPU scaling,
4-GPU servers, each model's restart cost); restarts free; 8-GPU servers;
Hare's own round times for every synchronous step (``speed="task"``, the
control that makes the two speed models equal); that without restarts; and
Gavel's policy under the control. Prints weighted JCT (h), average JCT (h),
makespan (h) and the share done within 25 minutes, per cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.hare.run import HareExperiment, workload
from experiments.hare.sync import run_jobs
from scheduling.registry import DEFAULT_POLICY
from world.hare import DEFAULT_CLUSTERS, cluster_shape

VARIANTS: dict[str, dict[str, Any]] = {
    "hops": {},
    "hops, restarts 0": {"restart_s": 0.0},
    "hops, 8-GPU servers": {"server_gpus": 8},
    "hops, Hare's speeds": {"speed": "task"},
    "hops, Hare's speeds, restarts 0": {"speed": "task", "restart_s": 0.0},
    "gavel, Hare's speeds": {"speed": "task", "policy": "gavel"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    exp = HareExperiment(jobs=args.jobs, seed=args.seed)
    for cluster in DEFAULT_CLUSTERS:
        jobs, _ = workload(exp, cluster)
        shape = cluster_shape(cluster)
        print(f"{cluster} ({len(jobs)} jobs)", flush=True)
        for name, kw in VARIANTS.items():
            options = dict(kw)
            policy = str(options.pop("policy", DEFAULT_POLICY))
            m = run_jobs(jobs, shape, policy, **options).result
            print(f"  {name:34s} weighted JCT {m.weighted_jct_h:7.2f} h  avg {m.avg_jct_h:6.3f} h"
                  f"  makespan {m.makespan_h:6.2f} h  <=25 min {m.share_done_25min:4.0%}",
                  flush=True)


if __name__ == "__main__":
    main()
