"""How much of Sia's solve time would a better starting solution save?

Runs the 512-GPU, 500-job simulation under Sia with the LP optimum rounded
down as its ILP's start (policy ``sia-lp-start``), keeps every round's ILP
that took HiGHS longer than ``--min-s`` (with that start), then solves each
kept ILP again three times: from that same start, from the start of
``SiaSettings(start="search")`` (scheduling/policies/sia/start.py,
Sia's default), and from the optimal solution the first solve found. The
last is the best any start could do; the gap (1e-4) and everything else
stay as Sia sets them.

    .venv/bin/python bench/sia_start.py [--min-s 1.0]   # --min-s 0: about 3 minutes
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scheduling.policies.sia.policy as sia
from experiments.common.simrun import RunSpec, simulate
from scheduling.ilp import MipModel, MipOptions, MipResult, Relaxation, solve_mip


@dataclass(frozen=True)
class Kept:
    model: MipModel
    options: MipOptions
    start: Sequence[float] | None
    search: Sequence[float] | None  # the search start for the same ILP
    search_s: float  # the time the search took


def record_hard_rounds(min_s: float) -> tuple[list[Kept], float, int]:
    """The simulation's ILPs slower than ``min_s``, the total solve time and
    the number of solves."""
    kept: list[Kept] = []
    total = [0.0, 0]
    solve, relax, solve_round = sia.solve_mip, sia.solve_relaxation_duals, sia.SiaPolicy._solve
    seen: dict[str, Any] = {}

    def round_args(self: sia.SiaPolicy, *args: Any) -> MipResult:
        seen["args"] = args
        return solve_round(self, *args)

    def relaxing(*args: Any, **kwargs: Any) -> Relaxation:
        seen["relaxed"] = result = relax(*args, **kwargs)
        return result

    def recording(model: MipModel, options: MipOptions | None = None, *,
                  maximize: bool = True, incumbent: Sequence[float] | None = None) -> MipResult:
        result = solve(model, options, maximize=maximize, incumbent=incumbent)
        total[0] += result.solve_s
        total[1] += 1
        if result.solve_s > min_s and options is not None:
            relaxed, t0 = seen["relaxed"], time.perf_counter()
            search = None
            if relaxed.values is not None:
                search = sia.search_start(*seen["args"], relaxed.values, relaxed.reduced)
            kept.append(Kept(model, options, incumbent, search, time.perf_counter() - t0))
        return result

    # The policy module's own names, swapped for this run only.
    sia.solve_mip, sia.solve_relaxation_duals = recording, relaxing
    sia.SiaPolicy._solve = round_args  # type: ignore[method-assign]
    try:
        simulate(RunSpec(cluster="paper-sim-512", workload="paper-sim", policy="sia-lp-start"))
    finally:
        sia.solve_mip, sia.solve_relaxation_duals = solve, relax
        sia.SiaPolicy._solve = solve_round  # type: ignore[method-assign]
    return kept, total[0], int(total[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--min-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    kept, total, solves = record_hard_rounds(args.min_s)
    print(f"{solves} solves, {total:.1f} s in HiGHS; {len(kept)} took over {args.min_s:g} s")
    as_sia = with_search = search_s = with_best = 0.0
    found = 0  # ILPs whose search start is already within the gap of the answer
    for i, k in enumerate(kept):
        t0 = time.perf_counter()
        first = solve_mip(k.model, k.options, maximize=True, incumbent=k.start)
        t1 = time.perf_counter()
        searched = solve_mip(k.model, k.options, maximize=True, incumbent=k.search)
        t2 = time.perf_counter()
        again = solve_mip(k.model, k.options, maximize=True, incumbent=np.round(first.values))
        t3 = time.perf_counter()
        as_sia += t1 - t0
        with_search += t2 - t1
        search_s += k.search_s
        with_best += t3 - t2
        if k.search is not None and first.has_solution:
            found += k.model.objective(k.search) >= first.objective - k.options.mip_rel_gap * abs(
                first.objective
            )
        print(f"  round ILP {i:3}: {k.model.num_cols:5} columns, from the rounded LP "
              f"{t1 - t0:6.2f} s (objective {first.objective:.4f}), from the search "
              f"{t2 - t1:6.2f} s ({searched.objective:.4f}), from the optimum "
              f"{t3 - t2:6.2f} s ({again.objective:.4f})", flush=True)
    print(f"total: from the rounded LP {as_sia:.1f} s, from the search {with_search:.1f} s "
          f"(+{search_s:.1f} s searching), from the optimum {with_best:.1f} s; the search "
          f"start was within the gap of the answer in {found} of {len(kept)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
