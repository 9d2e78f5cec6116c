"""How much of Sia's solve time would a better starting solution save?

Runs the 512-GPU, 500-job simulation under Sia (as ``bench/sim_speed.py``
does), keeps every round's ILP that took HiGHS longer than ``--min-s`` (with
the start Sia gives it: the LP optimum rounded down), then solves each kept
ILP again twice: from that same start, and from the optimal solution the
first solve found. The second is the best any start could do; the gap
(1e-4) and everything else stay as Sia sets them.

    .venv/bin/python bench/sia_start.py [--min-s 1.0]   # about 5 minutes
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import services.scheduler.baselines.sia as sia
from hops.simrun import RunSpec, simulate
from services.scheduler.ilp import MipModel, MipOptions, MipResult, solve_mip


@dataclass(frozen=True)
class Kept:
    model: MipModel
    options: MipOptions
    start: Sequence[float] | None


def record_hard_rounds(min_s: float) -> tuple[list[Kept], float, int]:
    """The simulation's ILPs slower than ``min_s``, the total solve time and
    the number of solves."""
    kept: list[Kept] = []
    total = [0.0, 0]
    solve = sia.solve_mip

    def recording(model: MipModel, options: MipOptions | None = None, *,
                  maximize: bool = True, incumbent: Sequence[float] | None = None) -> MipResult:
        result = solve(model, options, maximize=maximize, incumbent=incumbent)
        total[0] += result.solve_s
        total[1] += 1
        if result.solve_s > min_s and options is not None:
            kept.append(Kept(model, options, incumbent))
        return result

    # The policy module's own name for the solver, swapped for this run only.
    sia.solve_mip = recording
    try:
        simulate(RunSpec(cluster="paper-sim-512", workload="paper-sim", policy="sia"))
    finally:
        sia.solve_mip = solve
    return kept, total[0], int(total[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--min-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    kept, total, solves = record_hard_rounds(args.min_s)
    print(f"{solves} solves, {total:.1f} s in HiGHS; {len(kept)} took over {args.min_s:g} s")
    as_sia = with_best = 0.0
    for i, k in enumerate(kept):
        t0 = time.perf_counter()
        first = solve_mip(k.model, k.options, maximize=True, incumbent=k.start)
        t1 = time.perf_counter()
        again = solve_mip(k.model, k.options, maximize=True, incumbent=np.round(first.values))
        t2 = time.perf_counter()
        as_sia += t1 - t0
        with_best += t2 - t1
        print(f"  round ILP {i:3}: {k.model.num_cols:5} columns, from Sia's start "
              f"{t1 - t0:6.2f} s (objective {first.objective:.4f}), from the optimum "
              f"{t2 - t1:6.2f} s ({again.objective:.4f})", flush=True)
    print(f"total: from Sia's start {as_sia:.1f} s, from the optimum {with_best:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
