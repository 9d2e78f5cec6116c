"""What the live leader's explanations add to a plan at 512 GPUs: the
reasons (scheduling.explain.with_reasons, in the planning thread) and the
work on the event loop after the plan is published (the records' reasons,
the hops_explain records and which changed, the forecast task's bytes;
scheduling/live/explain.py), against the plan itself. The forecast runs in
another process and is not counted.

    PYTHONPATH=. python -m bench.explain_shell [trials] [--gpus 512]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench.plan_round import p95
from bench.synthetic import make_cluster, make_queue
from scheduling.explain import with_reasons
from scheduling.layers.profiling_first import ProfilingFirst
from scheduling.live import explain as xp
from scheduling.live import forecasting
from scheduling.live.state import LiveJobRecord
from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.registry import profiling_settings
from shared.snapshot import Snapshot


def trial(gpus: int, seed: int) -> tuple[float, float, float]:
    """Seconds of the plan, of the reasons and of the loop's explain work."""
    rng = random.Random(gpus * 7919 + seed)
    cluster = make_cluster(rng, gpus)
    queue, estimates = make_queue(rng, cluster)
    snap = Snapshot(now=7200.0, cluster=cluster, jobs=tuple(queue), estimates=estimates)
    settings = HopsSettings()
    policy = HopsPolicy(settings).wrapped(ProfilingFirst(profiling_settings(settings)))
    records = {j.id: LiveJobRecord(spec=j.spec, submitted_at=0.0, phase=j.phase)
               for j in queue}
    t0 = time.perf_counter()
    plan = policy.plan(snap)
    t1 = time.perf_counter()
    plan = with_reasons(snap, plan, next_plan_at=snap.now + 60.0)
    t2 = time.perf_counter()
    whys = xp.job_whys(plan, snap, records, {}, snap.now)
    xp.reason_entries({}, whys, snap.now)
    estimated, measured = xp.throughputs(snap, plan)
    new = xp.explains(records, xp.Sources(at=snap.now, round=1, term=1, whys=whys, receipts={},
                                          estimated=estimated, measured=measured))
    xp.changed({}, new)
    forecasting.task_bytes(snap, plan, 60.0, 1)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("trials", nargs="?", type=int, default=5)
    parser.add_argument("--gpus", type=int, default=512)
    args = parser.parse_args()
    runs = [trial(args.gpus, t) for t in range(args.trials)]
    # the reasons are on the planning path (the 5% budget of the plan's
    # time); the loop's work follows the plan's publication
    print("gpus | plan_median_s | reasons_median_s | reasons_% | loop_median_s | loop_p95_s"
          " | loop_%")
    plan_s, reasons_s, loop_s = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"{args.gpus} | {plan_s:.3f} | {reasons_s:.4f} | {100 * reasons_s / plan_s:.1f} | "
          f"{loop_s:.4f} | {p95([r[2] for r in runs]):.4f} | {100 * loop_s / plan_s:.1f}")


if __name__ == "__main__":
    main()
