"""One forecast of the whole queue (scheduling.forecast.forecast, 8 draws,
what-ifs on) at 512 GPUs and 500 jobs: the issue's budget is 2 s p95.

Each trial builds a synthetic cluster and queue (bench/synthetic.py), plans
a first round with Hops, lets the plan's jobs run (some progress, a
measured throughput within 10% of the estimate), plans the next round from
that snapshot, and times the forecast after that plan, calibrated by a state whose every
band is full. Prints the median
and p95 over the trials, with the running and waiting jobs of each.

    .venv/bin/python bench/forecast_speed.py [TRIALS] [--gpus 512] [--jobs 500] [--draws 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from bench.plan_round import p95
from bench.synthetic import make_cluster, make_queue
from scheduling.forecast import Calibration, Residual, forecast
from scheduling.forecast.calibration import AHEAD_ROUNDS, POSITIONS
from scheduling.layers.profiling_first import ProfilingFirst
from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.policy import Policy
from scheduling.registry import profiling_settings
from scheduling.rounds import ROUND_S
from shared.estimate import config_throughput
from shared.snapshot import JobState, Plan, Snapshot


def running_after(snap: Snapshot, plan: Plan, rng: random.Random) -> Snapshot:
    """``snap`` one round later: the plan's jobs run, some way through."""
    chosen = {a.job_id: a.config for a in plan.assignments}
    now = snap.now + ROUND_S
    jobs: list[JobState] = []
    for j in snap.jobs:
        config = chosen.get(j.id)
        if config is None:
            jobs.append(msgspec.structs.replace(j, wait_s=j.wait_s + ROUND_S))
            continue
        est = config_throughput(snap.estimates[j.id], snap.cluster, config)
        jobs.append(msgspec.structs.replace(
            j, phase="running", current=config, throughput=est * rng.uniform(0.9, 1.1),
            done_samples=j.spec.total_samples * rng.uniform(0.0, 0.5),
            throughput_since=snap.now + 30.0, attained_gpu_s=config.total_gpus * ROUND_S))
    return msgspec.structs.replace(snap, now=now, jobs=tuple(jobs))


def full_calibration(rng: random.Random) -> Calibration:
    """A calibration state at its largest: every band full of residuals."""
    bands = (len(AHEAD_ROUNDS) + 1) * (len(POSITIONS) + 1)
    limit = Calibration().limit

    def some() -> tuple[Residual, ...]:
        return tuple(Residual(rng.gauss(0, 0.3), rng.gauss(-0.2, 0.3), rng.gauss(-0.2, 0.3), b)
                     for b in range(bands) for _ in range(limit))

    return Calibration(start=some(), finish=some())


def trial(gpus: int, n_jobs: int, draws: int, seed: int, policy: Policy) -> tuple[float, int, int]:
    rng = random.Random(gpus * 104729 + seed)
    cluster = make_cluster(rng, gpus)
    queue, estimates = make_queue(rng, cluster, depth=4.0)
    queue = queue[:n_jobs]
    # Submissions span [0, 3600): at 5400 and a round later, the last
    # hour's arrivals are some of the queue, which the model expects again.
    snap = Snapshot(now=5400.0, cluster=cluster, jobs=tuple(queue),
                    estimates={j.id: estimates[j.id] for j in queue})
    snap = running_after(snap, policy.plan(snap), rng)
    plan = policy.plan(snap)
    cal = full_calibration(rng)
    began = time.perf_counter()
    out = forecast(snap, plan, round_s=ROUND_S, seed=seed, draws=draws, whatif=True,
                   calibration=cal)
    spent = time.perf_counter() - began
    running = sum(1 for f in out.jobs if f.position == 0)
    return spent, running, len(out.jobs) - running


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trials", nargs="?", type=int, default=10)
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--draws", type=int, default=8)
    args = parser.parse_args()
    settings = HopsSettings()
    policy = HopsPolicy(settings).wrapped(ProfilingFirst(profiling_settings(settings)))
    walls: list[float] = []
    print("trial | running | waiting | forecast_s")
    for seed in range(args.trials):
        spent, running, waiting = trial(args.gpus, args.jobs, args.draws, seed, policy)
        walls.append(spent)
        print(f"{seed} | {running} | {waiting} | {spent:.3f}", flush=True)
    print(f"gpus {args.gpus}, jobs {args.jobs}, draws {args.draws}, what-if and calibration on: "
          f"median {statistics.median(walls):.3f} s, p95 {p95(walls):.3f} s")


if __name__ == "__main__":
    main()
