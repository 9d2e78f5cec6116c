"""Sim-live parity of Hare (issue 39, deliverable 4; docs/hare.md §7,
"Sim-live parity"): one small workload of relaxed jobs run through the task
simulator and live, per-job and weighted JCT side by side.

* **Live**: the whole stack as ``hops up --policy hare-eft`` runs it
  (:class:`tests.livestack.LiveStack`: nats-server, every service, one
  scheduler, the EMULATED cluster of ``examples/cluster-hare.yaml`` at
  ``--time-scale``), each job submitted at its arrival. A job's JCT is its
  ``job_finished`` time less its record's ``submitted_at``, times the time
  scale (jobs' time). By default one job per model runs first, until the
  estimator has its signature's throughput on every GPU type, and is then
  cancelled (``--cold``: none), so that the measured jobs find a shared
  profile on every type and are sequenced without a profiling run of their
  own.
* **Sim (leader's times)**: :func:`simulator.tasks.simulate` with the same
  task policy (``hare-eft``), the live GPUs in the leader's order, each job
  arriving when it was submitted, and each job's T^c and T^s as the live
  leader plans them: the estimator asked for the jobs' estimates after the
  run, turned into times by the leader's own
  :func:`scheduling.live.taskrun.task_job`, at time scale 1 (jobs' time).
  The sim runs the leader's way: its horizon, from the settings object the
  leader replans with (``SchedulerSettings.live_tasks``), its replans at
  barriers and its rule for what a replan keeps.
* **Sim (executor's times)**: the same with the emulated executor's T^c
  and T^s (the world model's, ``executor.tasks.task_times``): what the GPUs
  really spend, so the difference between the two sims is the leader's
  estimates' error.
* **Sim with the loop**: the same (leader's times) with each barrier passing
  the live loop's turnaround after its synchronisation, the median live
  gap of the rounds the sim starts at their barrier: what is left once the
  live loop's own cost is counted.

Weights are all 1: a live job carries no weight (``JobSpec`` has none; the
leader's ``TaskJob`` has the default). Target: the live weighted JCT within
10% of the simulator's (leader's times).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import structlog

from executor.tasks import task_times as executor_times
from scheduling.live import snapshot as snap
from scheduling.live import taskrun as tr
from scheduling.live.state import decode_record
from scheduling.live.tasks import LiveTaskSettings
from scheduling.policies.hare.model import Gpu, TaskJob
from scheduling.registry import make_task_policy
from services.scheduler.estimates import fetch_estimates
from services.scheduler.settings import scheduler_settings
from shared.estimate import JobEstimate
from shared.events import EstimateRequest
from shared.ids import JobId
from shared.job import JobSpec
from shared.records import NodeRecord
from simulator.tasks import TaskSimSettings, simulate
from tests.helpers import catalog_spec
from tests.livestack import TEST_ENV, LiveStack
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.truth import GroundTruth

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "cluster-hare.yaml"
POLICY = "hare-eft"
TARGET = 0.10


class Job(NamedTuple):
    """One relaxed job of the workload: S micro-batches a round, ``arrival_s``
    in the jobs' time from the first submission."""

    id: str
    model: str
    s: int
    rounds: int
    arrival_s: float


# Five jobs of the two models of examples/jobs-hare.yaml, arriving over 4 s
# of the jobs' time (written out: the project's generator draws Table 2's
# stand-ins for minutes to hours, which the live catalog does not run).
WORKLOAD = (
    Job("p0", "resnet50-imagenet", 4, 6, 0.0),
    Job("p1", "resnet18-cifar10", 4, 40, 0.5),
    Job("p2", "resnet50-imagenet", 2, 6, 1.5),
    Job("p3", "resnet18-cifar10", 2, 30, 2.5),
    Job("p4", "resnet50-imagenet", 3, 4, 4.0),
)


def spec_of(job: Job) -> dict[str, Any]:
    spec = catalog_spec(job.id, 0, job.model, requirements=[1, 2])
    return {**spec, "total_samples": spec["batch_size"] * job.s * job.rounds,
            "sync_scale": job.s}


class LiveRun(NamedTuple):
    """What the live run gives the comparison, in the jobs' time from the
    first submission: each job's submission, first compute and finish; the
    jobs as the leader plans them; the GPUs in the leader's order."""

    submitted: dict[str, float]
    first: dict[str, float]
    finished: dict[str, float]
    gap: dict[str, float]
    leader_jobs: tuple[TaskJob, ...]
    gpus: tuple[Gpu, ...]
    gaps: dict[tuple[str, int], float]
    pass_ms: tuple[dict[str, list[float]], ...] = ()  # the leader's pass, per step


def stack_env(resend_s: float) -> dict[str, str]:
    return {"HOPS_TASK_RESEND_S": str(resend_s)}


def leader_settings(resend_s: float) -> LiveTaskSettings:
    """What the stack's leader replans with: its settings from the
    environment the stack gives it (``HOPS_TASK_HORIZON`` included)."""
    return scheduler_settings({**os.environ, **TEST_ENV, **stack_env(resend_s)}).live_tasks()


def warm_up(stack: LiveStack, timeout: float = 120.0) -> bool:
    """Run one job per model until the estimator has their signature's
    throughput on every GPU type (both profiling runs reported), then
    cancel them: the measured jobs find a profile on every type. False
    when the timeout came first (the run goes on with what there is)."""
    warm = [spec_of(Job(f"warm-{i}", m, 4, 10_000, 0.0))
            for i, m in enumerate(sorted({j.model for j in WORKLOAD}))]
    for spec in warm:
        assert stack.submit(spec).get("ok"), spec
    ids = [s["id"] for s in warm]
    deadline = time.time() + timeout
    covered = False
    while not covered and time.time() < deadline:
        time.sleep(1.0)
        nodes = node_records(stack)
        estimates = ask_estimates(stack, ids, nodes)
        types = {n.server.gpu_type for n in nodes}
        covered = all(j in estimates and types <= set(estimates[j].by_type) for j in ids)
    for j in ids:
        body = json.dumps({"type": "cancel_job", "job_id": j}).encode()
        stack.bus_().request("hops.v1.jobs.cancel", body)
    stack.wait_final(ids, timeout=60)
    return covered


def node_records(stack: LiveStack) -> list[NodeRecord]:
    return [msgspec.json.decode(json.dumps(v).encode(), type=NodeRecord)
            for v in stack.nodes().values()]


def ask_estimates(stack: LiveStack, ids: list[str], nodes: list[NodeRecord]
                  ) -> dict[JobId, JobEstimate]:
    """The estimator's answer for jobs ``ids`` on the cluster of ``nodes``."""
    bus = stack.bus_()
    specs = tuple(decode_record(json.dumps(stack.record(j)).encode()).spec for j in ids)
    request = EstimateRequest(jobs=specs, cluster=snap.cluster_of(nodes))
    return bus.call(fetch_estimates(bus.nc, [request], {}, 10.0, structlog.get_logger()))


def run_live(time_scale: float, cold: bool, resend_s: float, root: Path) -> LiveRun:
    with LiveStack(root, CLUSTER.read_text(), schedulers=1, policy=POLICY,
                   time_scale=time_scale, env=stack_env(resend_s)) as stack:
        if not cold and not warm_up(stack):  # one job per model profiles its signature
            print("warm-up: not every type profiled in time; the leader's times show which")
        t0 = time.time()
        for job in sorted(WORKLOAD, key=lambda j: j.arrival_s):
            time.sleep(max(0.0, t0 + job.arrival_s / time_scale - time.time()))
            reply = stack.submit(spec_of(job))
            assert reply.get("ok"), reply
        ids = [j.id for j in WORKLOAD]
        phases = stack.wait_final(ids, timeout=600)
        if set(phases.values()) != {"finished"}:
            raise SystemExit(f"not every job finished: {phases}")
        run = _collect(stack, ids, time_scale)
        summaries = stack.log_events("scheduler-a", "task pass times")
        return run._replace(pass_ms=tuple(e["ms_median_p95"] for e in summaries))


def _collect(stack: LiveStack, ids: list[str], scale: float) -> LiveRun:
    bus = stack.bus_()
    records = {j: decode_record(json.dumps(stack.record(j)).encode()) for j in ids}
    t0 = min(r.submitted_at for r in records.values())  # the first submission
    submitted = {j: (r.submitted_at - t0) * scale for j, r in records.items()}
    finished = {j: (bus.job_events(j, "job_finished")[0].body["at"] - t0) * scale for j in ids}
    done = [d for j in ids for d in bus.stored("HOPS_TASK_DONE", f"hops.v1.tasks.done.*.{j}")]
    runs = [Ran(d["job_id"], d["round"], (d["started_at"] - t0) * scale, (d["at"] - t0) * scale)
            for d in done]
    nodes = node_records(stack)
    gpus = tr.gpus_of(nodes)
    estimates = ask_estimates(stack, ids, nodes)
    types = {g.type for g in gpus}
    jobs = []
    for j, rec in records.items():
        job = tr.task_job(rec, estimates.get(JobId(j)), types, 0, 1.0)
        if isinstance(job, str):
            raise SystemExit(f"{j}: the leader's times are not known: {job}")
        jobs.append(msgspec.structs.replace(job, arrival_s=submitted[j]))
    return LiveRun(submitted, first_starts(runs), finished, round_gaps(runs), tuple(jobs), gpus,
                   each_gap(runs))


def with_executor_times(jobs: tuple[TaskJob, ...]) -> tuple[TaskJob, ...]:
    """The jobs with the emulated executor's T^c and T^s (jobs' time)."""
    truth = GroundTruth(cluster_arg(str(CLUSTER)), builtin_catalog())
    specs = {j.id: spec_of(j) for j in WORKLOAD}
    out = []
    for job in jobs:
        spec = msgspec.convert(specs[job.id], JobSpec)
        times = {t: executor_times(truth, spec, t, 1.0) for t in job.compute_s}
        out.append(msgspec.structs.replace(
            job, compute_s={t: x.compute_s for t, x in times.items()},
            sync_s={t: x.sync_s for t, x in times.items()}))
    return tuple(out)


class Ran(NamedTuple):
    """A task (an entry) that ran: its compute start and when its round's
    part was synchronised (gradients sent)."""

    job: str
    round: int
    start: float
    done: float


def first_starts(runs: list[Ran]) -> dict[str, float]:
    first: dict[str, float] = {}
    for r in runs:
        first[r.job] = min(first.get(r.job, r.start), r.start)
    return first


def each_gap(runs: list[Ran]) -> dict[tuple[str, int], float]:
    """Per (job, round r > 0), round r's first compute start less round
    r - 1's synchronisation (its last task's): the barrier's cost, where
    the live loop's release of a round and a GPU busy with others show."""
    start: dict[tuple[str, int], float] = {}
    done: dict[tuple[str, int], float] = {}
    for r in runs:
        key = (r.job, r.round)
        start[key] = min(start.get(key, r.start), r.start)
        done[key] = max(done.get(key, r.done), r.done)
    return {(job, rnd): at - done[(job, rnd - 1)] for (job, rnd), at in start.items()
            if (job, rnd - 1) in done}


def round_gaps(runs: list[Ran]) -> dict[str, float]:
    """Per job, the median of :func:`each_gap`."""
    gaps: dict[str, list[float]] = {}
    for (job, _), gap in each_gap(runs).items():
        gaps.setdefault(job, []).append(gap)
    return {job: statistics.median(g) for job, g in gaps.items()}


def turnaround(live: dict[tuple[str, int], float], sim: dict[tuple[str, int], float],
               at_once: float = 1e-3) -> float:
    """The live loop's cost per round: the median live gap of the rounds
    the simulator starts at their barrier (its gap under ``at_once``), where
    no GPU was busy with another job (0: no such round)."""
    free = [gap for key, gap in live.items() if sim.get(key, math.inf) < at_once]
    return statistics.median(free) if free else 0.0


class SimRun(NamedTuple):
    jct: dict[str, float]
    first: dict[str, float]
    gap: dict[str, float]
    gaps: dict[tuple[str, int], float]


def run_sim(jobs: tuple[TaskJob, ...], gpus: tuple[Gpu, ...],
            leader: LiveTaskSettings | None = None, release_s: float = 0.0) -> SimRun:
    """The workload in the task simulator: every task a single round here
    (a small workload fits the macro-task budget); with ``leader``, the
    live leader's settings, its horizon and replans (``--horizon``), and
    each barrier ``release_s`` after its synchronisation."""
    settings = TaskSimSettings(record=True) if leader is None else TaskSimSettings.of_leader(
        leader, record=True, release_s=release_s)
    result = simulate(jobs, gpus, make_task_policy(POLICY), settings)
    runs = [Ran(t.job, t.first_round, t.start_s + t.switch_s, t.done_s) for t in result.tasks]
    return SimRun({o.id: o.jct_s for o in result.jobs}, first_starts(runs), round_gaps(runs),
                  each_gap(runs))


def pct(live: float, sim: float) -> str:
    return f"{100.0 * (live - sim) / sim:+6.1f}%" if sim > 0 else "   n/a"


def report(live: LiveRun, sim: SimRun, sim_ex: SimRun, scale: float, cold: bool,
           offline: SimRun | None = None, looped: tuple[float, SimRun] | None = None) -> None:
    jct = {j: live.finished[j] - live.submitted[j] for j in live.finished}
    times = {j.id: j for j in live.leader_jobs}
    print(f"policy {POLICY}, {CLUSTER.relative_to(ROOT)}, time scale x{scale:g}, "
          f"{'cold (each job profiled)' if cold else 'warm (shared profiles)'}; "
          "times in seconds of the jobs' time")
    print("leader's T^c / T^s per job (RTX3090, TitanXP):")
    for tj in times.values():
        cs = ", ".join(f"{tj.compute_s[t]:.3f}/{tj.sync(t):.3f}" for t in sorted(tj.compute_s))
        print(f"  {tj.id} {tj.model} S={tj.tasks_per_round} rounds={tj.rounds}: {cs}")
    print(f"{'job':4} {'w':>3} {'arrival':>8} {'sim JCT':>8} {'live JCT':>9} {'diff':>7}"
          f" {'sim(ex)':>8} {'diff':>7} {'wait sim':>8} {'live':>6} {'gap sim':>8} {'live':>6}")
    for j in sorted(jct):
        print(f"{j:4} {1:>3} {live.submitted[j]:8.2f} {sim.jct[j]:8.2f} {jct[j]:9.2f} "
              f"{pct(jct[j], sim.jct[j])} {sim_ex.jct[j]:8.2f} {pct(jct[j], sim_ex.jct[j])} "
              f"{sim.first[j] - live.submitted[j]:8.2f} {live.first[j] - live.submitted[j]:6.2f} "
              f"{sim.gap.get(j, 0.0):8.3f} {live.gap.get(j, 0.0):6.3f}")
    print("wait: first compute start less arrival; gap: median of a round's first compute "
          "start less the previous round's synchronisation")
    if looped is not None:
        loop, with_loop = looped
        w_loop = sum(with_loop.jct.values())
        print(f"the live loop's turnaround (median live gap of the rounds the sim starts at "
              f"their barrier): {loop:.3f} s; the sim with it at every barrier: " + ", ".join(
                  f"{j} {with_loop.jct[j]:.2f} ({pct(jct[j], with_loop.jct[j]).strip()})"
                  for j in sorted(with_loop.jct)) + f"; weighted {w_loop:.2f} (live "
              f"{pct(sum(jct.values()), w_loop).strip()})")
    if offline is not None:
        w_off = sum(offline.jct.values())
        print("sim without the horizon (every round in view, replans at arrivals): " + ", ".join(
            f"{j} {offline.jct[j]:.2f}" for j in sorted(offline.jct)) + f"; weighted {w_off:.2f}"
            f" (live {pct(sum(jct.values()), w_off).strip()})")
    w_sim, w_live, w_ex = sum(sim.jct.values()), sum(jct.values()), sum(sim_ex.jct.values())
    print(f"weighted JCT (sum of w x JCT): sim {w_sim:.2f}, live {w_live:.2f} "
          f"({pct(w_live, w_sim).strip()}); sim with the executor's times {w_ex:.2f} "
          f"(live {pct(w_live, w_ex).strip()})")
    met = abs(w_live - w_sim) <= TARGET * w_sim
    print(f"target: live weighted JCT within {TARGET:.0%} of the sim's: "
          f"{'met' if met else 'NOT met'}")
    print(CAUSES)


CAUSES = """what the columns share and what they do not:
- the same planner: the sim runs the leader's horizon (its settings object,
  HOPS_TASK_HORIZON), replans at arrivals and barriers (rounds applied, a
  job's last one its end) and keeps what the leader keeps at a replan
  (scheduling.live.tasks.assumed_started); "sim without the horizon" is
  the paper's offline plan, for reference;
- the same sync model: the emulated executor spends the world model's
  cost of a synchronised step on the cluster's links (world.hare.
  step_sync_time), which the leader estimates; sim(ex) runs the truth's
  times, sim the leader's estimates of them;
- not modelled: the live loop's turnaround per round (a report's trip, the
  leader's count and state write, its resend's trip), wall time that
  the time scale multiplies into the jobs' time; "the sim with it" adds
  the measured median at every barrier;
- profiling and estimates: a job with no profile of its signature is
  profiled first (--cold), and the leader asks the estimator at most once
  per HOPS_TASK_RESEND_S (--resend-s);
- timing: planned starts on the wall clock, the executor's timers and the
  submission's trip, on a machine shared with the whole stack."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=2.0,
                        help="the emulated cluster's time scale (default 2)")
    parser.add_argument("--resend-s", type=float, default=0.25,
                        help="HOPS_TASK_RESEND_S, which also spaces the leader's estimate "
                             "requests (default 0.25 wall seconds)")
    parser.add_argument("--cold", action="store_true",
                        help="no warm-up jobs: every job is profiled before it runs")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the stack's data (logs) in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hops-hare-parity-") as tmp:
        live = run_live(args.time_scale, args.cold, args.resend_s, args.keep or Path(tmp))
    leader = leader_settings(args.resend_s)
    sim = run_sim(live.leader_jobs, live.gpus, leader)
    sim_ex = run_sim(with_executor_times(live.leader_jobs), live.gpus, leader)
    print(f"sim: the leader's horizon of {leader.horizon_rounds} rounds, replanning at "
          "arrivals and barriers")
    loop = turnaround(live.gaps, sim.gaps)
    looped = (loop, run_sim(live.leader_jobs, live.gpus, leader, loop))
    report(live, sim, sim_ex, args.time_scale, args.cold, run_sim(live.leader_jobs, live.gpus),
           looped)
    for ms in live.pass_ms:  # services.scheduler.passtimes, warm-up included
        print("the leader's pass that sent a revision, wall ms median/p95 of 50 (warm-up "
              "included): " + ", ".join(f"{k} {v[0]:g}/{v[1]:g}" for k, v in ms.items()))
    print(f"HOPS_TASK_RESEND_S {args.resend_s:g} s; load average (1 min) at the end: "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
