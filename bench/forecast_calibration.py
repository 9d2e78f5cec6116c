"""How well the forecasts hold: replays Table 4 and the ElasticFlow traces
under Hops (as ``hops experiment table4`` / ``hops experiment traces`` run
them) with forecasting on (``SimSettings.forecast``): the whole queue is
forecast at every round's first plan, so at each job's submission round and
every round while it waits, and each waiting job's forecast is compared with
what then happened.

Prints, for start and finish: the share of forecasts whose 10-90% interval
holds the actual value (target 75-90%), and the median absolute error with
the share of forecasts within max(1 round, 20% of the actual wait) (the
wait to the start, or to the finish for the finish; the target: median
error at or below the median of that bound), overall, by job size (its
largest requirement, GPUs) and by the actual wait to the start.

    .venv/bin/python bench/forecast_calibration.py [--only table4,cluster01,...]
        [--limit N] [--draws 8] [--seed 0] [--out FILE.json] [--preempt] [--no-arrivals]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common.simrun import RunSpec, prepare
from experiments.tables.define import define
from scheduling.registry import make_policy, profile_reuse, resolve
from simulator.engine import Simulation
from simulator.forecasting import ForecastRecord
from simulator.settings import SimSettings

RUNS = ("table4", "cluster01", "cluster02", "cluster03", "cluster04")
SIZES = ((1, 1), (2, 4), (5, 8), (9, 10**6))
WAITS_H = ((0.0, 0.25), (0.25, 1.0), (1.0, 4.0), (4.0, 10**6))


def run_specs(only: Sequence[str], limit: int | None, seed: int) -> list[tuple[str, RunSpec]]:
    """The hops runs of Table 4 and the traces experiment (first ``limit`` jobs)."""
    out: list[tuple[str, RunSpec]] = []
    if "table4" in only:
        exp = define("table4", seed=seed, first_n=limit, policies=("hops",))
        out += [("table4", spec) for _, spec in exp.runs]
    traces = [f"elasticflow-{n}" for n in only if n.startswith("cluster")]
    if traces:
        exp = define("traces", seed=seed, trace=",".join(traces), first_n=limit,
                     policies=("hops",))
        out += [(label.split("/")[0], spec) for label, spec in exp.runs]
    return out


def replay(spec: RunSpec, draws: int, preempt: bool = False,
           arrivals: bool = True) -> tuple[tuple[ForecastRecord, ...], float]:
    """``spec`` as simulate() runs it, with forecasts on; the records and the
    wall time."""
    policy_spec = resolve(spec.policy, priority=spec.priority, lam=spec.lam)
    cluster, truth, jobs = prepare(spec)
    settings = SimSettings(round_s=spec.round_s, restart_s=spec.restart_s, seed=spec.seed,
                           r_num=policy_spec.r_num, profile_reuse=profile_reuse(policy_spec),
                           forecast=True, forecast_draws=draws, forecast_preempt=preempt,
                           forecast_arrivals=arrivals)
    began = time.perf_counter()
    result = Simulation(cluster, jobs, make_policy(policy_spec), truth, settings).run()
    return result.forecasts, time.perf_counter() - began


def _stats(recs: Sequence[ForecastRecord], finish: bool, round_s: float) -> dict[str, float]:
    rows = []
    for r in recs:
        actual = r.actual_finish if finish else r.actual_start
        if actual is None or r.actual_start is None:
            continue
        f = r.forecast
        point, lo, hi = ((f.finish, f.finish_lo, f.finish_hi) if finish
                         else (f.start, f.start_lo, f.start_hi))
        # The bound: one round or 20% of the time waited for the
        # event (to the start; to the finish for the finish).
        bound = max(round_s, 0.2 * (actual - r.at))
        rows.append((lo <= actual <= hi, abs(point - actual), bound))
    if not rows:
        return {"n": 0}
    return {
        "n": len(rows),
        "coverage": sum(c for c, _, _ in rows) / len(rows),
        "median_abs_err_s": statistics.median(e for _, e, _ in rows),
        "median_bound_s": statistics.median(b for _, _, b in rows),
        "within_bound": sum(e <= b for _, e, b in rows) / len(rows),
    }


def _buckets(recs: Sequence[ForecastRecord]) -> list[tuple[str, Callable[[ForecastRecord], bool]]]:
    out: list[tuple[str, Callable[[ForecastRecord], bool]]] = [("all", lambda r: True)]
    for lo, hi in SIZES:
        name = f"gpus {lo}-{hi}" if hi < 10**6 else f"gpus >={lo}"
        out.append((name, lambda r, lo=lo, hi=hi: lo <= r.gpus <= hi))
    for wlo, whi in WAITS_H:
        name = f"wait {wlo:g}-{whi:g} h" if whi < 10**6 else f"wait >={wlo:g} h"
        out.append((name, lambda r, wlo=wlo, whi=whi: r.actual_start is not None
                    and wlo * 3600 <= r.actual_start - r.at < whi * 3600))
    return out


def report(label: str, recs: Sequence[ForecastRecord], round_s: float) -> dict[str, object]:
    print(f"\n## {label}: {len(recs)} forecasts of waiting jobs")
    print("bucket | start n | start cover | start med err s | start med bound s | "
          "start within | finish cover | finish med err s | finish med bound s | finish within")
    table: dict[str, object] = {}
    for name, keep in _buckets(recs):
        sub = [r for r in recs if keep(r)]
        st, fi = _stats(sub, False, round_s), _stats(sub, True, round_s)
        table[name] = {"start": st, "finish": fi}
        if not st.get("n"):
            continue
        cells = [name, str(st["n"])]
        for s in (st, fi):
            cells += [f"{s.get('coverage', 0):.2f}", f"{s.get('median_abs_err_s', 0):.0f}",
                      f"{s.get('median_bound_s', 0):.0f}", f"{s.get('within_bound', 0):.2f}"]
        print(" | ".join(cells), flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default=",".join(RUNS))
    parser.add_argument("--limit", type=int, default=None, help="first N jobs of each run")
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--preempt", action="store_true",
                        help="the model's round replans preempt (forecast(preempt=True))")
    parser.add_argument("--no-arrivals", action="store_true",
                        help="no expected arrivals (forecast(arrivals=False))")
    args = parser.parse_args()
    results: dict[str, object] = {}
    for label, spec in run_specs(args.only.split(","), args.limit, args.seed):
        recs, wall = replay(spec, args.draws, args.preempt, not args.no_arrivals)
        print(f"\n{label}: {spec.workload}, first {spec.first_n or 'all'} jobs, "
              f"{wall:.0f} s", flush=True)
        results[label] = {"wall_s": wall, "table": report(label, recs, spec.round_s)}
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
