"""Sim-live parity of Hare on the REAL executor (issue 39, deliverable 4;
docs/hare.md §7, "Reduced parity run on the real executor"): a few small
relaxed jobs that really train on the CPU, run live and through the task
simulator, per-job and weighted JCT side by side.

* **Live**: the whole stack as ``hops up --executor real --policy hare-eft``
  runs it (:class:`tests.livestack.LiveStack`: nats-server, every service,
  the aggregator, one scheduler, one real executor), ``examples/train_cnn.py``
  and ``train_lm.py`` at the sizes of ``tests/test_live_hare_real.py`` on
  resident trainers, one core standing in for one GPU. Each job is submitted
  at its arrival (wall seconds: real jobs run at time scale 1). One job per
  script runs first, so that the measured jobs find their signature's shared
  profile (the signature is the model, batch size, parameters, command and
  working directory: S and the rounds are not in it) and are sequenced
  without a profiling run of their own. A job's JCT is its ``job_finished``
  time less its record's ``submitted_at``.
* **Sim**: :func:`simulator.tasks.simulate` with ``hare-eft``, the live GPUs
  in the leader's order, each job arriving when it was submitted, with the
  T^c and T^s the leader plans with (the estimator asked after the run,
  turned into times by the leader's :func:`scheduling.live.taskrun.task_job`),
  as :mod:`bench.hare_parity` does for the emulated executor; and **sim
  h4**, the same with the live loop's horizon (each revision sequences at
  most ``HOPS_TASK_HORIZON`` = 4 rounds of a job, replanning at every
  barrier: ``TaskSimSettings.horizon_rounds``), which orders the jobs as the
  live leader can.

Besides the JCTs, it prints what the live run spent: the median compute of a
micro-batch (a ``task_done``'s span over its micro-batches) against the
leader's T^c, and the median synchronisation (the last report of a round to
the aggregator's ``round_applied``) against the leader's T^s. Each job's
final parameters (object store ``hops_aggregator``, ``<job>/final``) are
compared bitwise with :func:`hops.trainer.api.reference_rounds` run here,
with one torch thread as the trainers run. Weights are all 1 (a live job
carries none). The issue sets no target for this run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import torch

from bench.hare_parity import LiveRun, SimRun, _collect, pct, run_sim
from hops.aggregator.codec import decode_params
from hops.trainer.api import load_task, reference_rounds
from hops.trainer.spec import task_config, task_script
from scheduling.live.taskrun import rounds_of
from scheduling.live.tasks import LiveTaskSettings
from scheduling.policies.hare.model import Gpu, TaskJob
from scheduling.registry import make_task_policy
from services.runtime.objects import get_object
from shared import subjects
from shared.gradients import decode_applied, final_name
from shared.job import JobSpec
from simulator.tasks import TaskSimSettings, simulate
from tests.livestack import LiveStack
from tests.test_live_hare_real import JOBS

ROOT = Path(__file__).resolve().parent.parent
POLICY = "hare-eft"
# One server of two CPU "GPUs" (the host's two cores, one each), with the
# communication measured on this host (examples/cluster-local-cpu.yaml's
# gpu type): the leader's T^s is a gloo all-reduce over loopback.
CLUSTER = """\
name: hare-parity-real
gpu_types:
  - {name: cpu, link_bandwidth: 2.5e8, net_bandwidth: 5.0e8, overlap_residual: 1.0,
     link_latency_s: 2.28e-3, net_latency_s: 2.28e-3}
servers:
  - {id: solo, gpu_type: cpu, gpus: 2}
"""
# The scripts and sizes of tests/test_live_hare_real.py: a micro-batch is a
# few milliseconds of one core.
SCRIPTS: dict[str, dict[str, Any]] = JOBS
ENV = {"HOPS_PROFILE_ITERS": "5", "HOPS_SAMPLE_S": "0.5", "HOPS_STOP_GRACE_S": "15",
       "HOPS_ALLOW_ROOT_JOBS": "1", "HOPS_TRAINERS_PER_GPU": "1",
       "HOPS_TASK_PARAMS_WAIT_S": "60"}


class Job(NamedTuple):
    """One relaxed job: a script of :data:`SCRIPTS`, S micro-batches a
    round, ``arrival_s`` wall seconds after the first submission."""

    id: str
    script: str
    s: int
    rounds: int
    arrival_s: float


WORKLOAD = (
    Job("r0", "cnn", 3, 8, 0.0),
    Job("r1", "lm", 2, 10, 0.5),
    Job("r2", "cnn", 4, 5, 1.0),
    Job("r3", "lm", 4, 6, 2.0),
)


def spec_of(job: Job, batch_scale: int = 1) -> dict[str, Any]:
    """The job's spec; its micro-batch ``batch_scale`` times the script's."""
    base = SCRIPTS[job.script]
    batch = base["batch_size"] * batch_scale
    return {"id": job.id, **base, "batch_size": batch, "total_samples": job.s * job.rounds * batch,
            "sync_scale": job.s, "requirements": [1, 2], "workdir": str(ROOT)}


class Measured(NamedTuple):
    """What the live run spent per job (wall seconds): the median compute of
    one micro-batch and the median synchronisation of a round; and whether
    the job got a profiling run of its own (a ``profile`` placement)."""

    compute: dict[str, float]
    sync: dict[str, float]
    profiled: dict[str, bool]


class Live(NamedTuple):
    run: LiveRun
    spent: Measured
    finals: dict[str, bytes | None]


def run_live(root: Path, resend_s: float, batch_scale: int) -> Live:
    env = {**ENV, "HOPS_TASK_RESEND_S": str(resend_s)}
    with LiveStack(root, CLUSTER, schedulers=1, env=env, executor="real",
                   policy=POLICY) as stack:
        warm = [spec_of(Job(f"warm-{name}", name, 3, 2, 0.0), batch_scale) for name in SCRIPTS]
        for spec in warm:
            assert stack.submit(spec).get("ok"), spec
        phases = stack.wait_final([s["id"] for s in warm], timeout=300)
        if set(phases.values()) != {"finished"}:
            raise SystemExit(f"the warm-up jobs did not finish: {phases}")
        t0 = time.time()
        for job in sorted(WORKLOAD, key=lambda j: j.arrival_s):
            time.sleep(max(0.0, t0 + job.arrival_s - time.time()))
            reply = stack.submit(spec_of(job, batch_scale))
            assert reply.get("ok"), reply
        ids = [j.id for j in WORKLOAD]
        phases = stack.wait_final(ids, timeout=300)
        if set(phases.values()) != {"finished"}:
            raise SystemExit(f"not every job finished: {phases}")
        run = _collect(stack, ids, 1.0)
        return Live(run, measured(stack, ids), {j: final_of(stack, j) for j in ids})


def measured(stack: LiveStack, ids: list[str]) -> Measured:
    bus = stack.bus_()
    compute: dict[str, float] = {}
    sync: dict[str, float] = {}
    for job in ids:
        done = bus.stored("HOPS_TASK_DONE", f"hops.v1.tasks.done.*.{job}")
        compute[job] = statistics.median(
            (d["ended_at"] - d["started_at"]) / (d["hi"] - d["lo"]) for d in done)
        last: dict[int, float] = {}
        for d in done:
            last[d["round"]] = max(last.get(d["round"], d["ended_at"]), d["ended_at"])
        applied = bus.stored("HOPS_AGG_APPLIED", subjects.agg_applied(job), decode_applied)
        sync[job] = statistics.median(a.at - last[a.round] for a in applied if a.round in last)
    profiled = {j: any(isinstance(m.body, dict) and m.body.get("mode") == "profile"
                       for m in bus.alloc_changes(j)) for j in ids}
    return Measured(compute, sync, profiled)


def final_of(stack: LiveStack, job: str) -> bytes | None:
    bus = stack.bus_()
    return bus.call(get_object(bus.nc.jetstream(), subjects.OBJ_AGGREGATOR, final_name(job)))


def reference_params(spec: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The job's parameters after its rounds run in one process here (one
    torch thread, as a CPU "GPU"'s trainer: the CNN's kernels split their
    sums by thread count)."""
    job = msgspec.convert(spec, JobSpec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        task = load_task(task_script(job), task_config(job))
        reference_rounds(task, job.sync_scale,
                         rounds_of(job.total_samples, job.sync_scale, job.batch_size))
    finally:
        torch.set_num_threads(threads)
    return {n: p.detach() for n, p in task.model.named_parameters()}


def bitwise(spec: Mapping[str, Any], final: bytes | None) -> bool:
    """Whether ``final`` (a ``<job>/final`` object) holds the reference's
    parameters bit for bit; no object is no match."""
    if final is None:
        return False
    got, want = decode_params(final), reference_params(spec)
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


HORIZON = LiveTaskSettings().horizon_rounds  # the stack leaves HOPS_TASK_HORIZON unset


def sim_horizon(jobs: tuple[TaskJob, ...], gpus: tuple[Gpu, ...]) -> dict[str, float]:
    """Each job's JCT in the simulator with the live loop's horizon."""
    result = simulate(jobs, gpus, make_task_policy(POLICY),
                      TaskSimSettings(horizon_rounds=HORIZON))
    return {o.id: o.jct_s for o in result.jobs}


def report(live: Live, sim: SimRun, sim_h: dict[str, float], same: dict[str, bool],
           batch_scale: int) -> None:
    run = live.run
    jct = {j: run.finished[j] - run.submitted[j] for j in run.finished}
    planned = {str(j.id): j for j in run.leader_jobs}
    gtype = run.gpus[0].type
    jobs = {j.id: j for j in WORKLOAD}
    print(f"policy {POLICY}, real executor, one server of {len(run.gpus)} CPU \"GPUs\" "
          f"(type {gtype}), micro-batches x{batch_scale} the scripts'; wall seconds")
    print(f"{'job':4} {'script':6} {'S':>2} {'rnds':>4} {'arrival':>7} {'sim JCT':>8} "
          f"{'live JCT':>8} {'diff':>7} {'sim h4':>6} {'diff':>7} {'wait sim':>8} {'live':>5} "
          f"{'T^c plan':>8} {'live':>6} {'T^s plan':>8} {'live':>6} {'gap sim':>7} {'live':>6} "
          "prof bitwise")
    for j in sorted(jct):
        tj, job = planned[j], jobs[j]
        print(f"{j:4} {job.script:6} {job.s:>2} {job.rounds:>4} {run.submitted[j]:7.2f} "
              f"{sim.jct[j]:8.2f} {jct[j]:8.2f} {pct(jct[j], sim.jct[j])} "
              f"{sim_h[j]:6.2f} {pct(jct[j], sim_h[j])} "
              f"{sim.first[j] - run.submitted[j]:8.2f} {run.first[j] - run.submitted[j]:5.2f} "
              f"{tj.compute_s[gtype]:8.4f} {live.spent.compute[j]:6.4f} "
              f"{tj.sync(gtype):8.4f} {live.spent.sync[j]:6.4f} "
              f"{sim.gap.get(j, 0.0):7.3f} {run.gap.get(j, 0.0):6.3f} "
              f"{'yes' if live.spent.profiled[j] else 'no':>4} {'yes' if same[j] else 'NO'}")
    print("wait: first compute start less arrival; T^c: one micro-batch's compute (live: "
          "median of the reports' spans per micro-batch); T^s: a round's synchronisation "
          "(live: median of the round's last report to its round_applied); gap: median of "
          "a round's first compute start less the previous round's last report; prof: the "
          "job got a profiling run of its own (a profile placement)")
    w_sim, w_live, w_h = sum(sim.jct.values()), sum(jct.values()), sum(sim_h.values())
    print(f"weighted JCT (sum of w x JCT, w = 1): sim {w_sim:.2f}, live {w_live:.2f} "
          f"({pct(w_live, w_sim).strip()}); sim h{HORIZON} {w_h:.2f} "
          f"(live {pct(w_live, w_h).strip()})")
    print(f"final parameters bitwise the one-process reference: "
          f"{sum(same.values())} of {len(same)} jobs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resend-s", type=float, default=0.5,
                        help="HOPS_TASK_RESEND_S, which also spaces the leader's estimate "
                             "requests (default 0.5 s)")
    parser.add_argument("--batch-scale", type=int, default=1,
                        help="each job's micro-batch this many times the sizes of "
                             "tests/test_live_hare_real.py (default 1: a few milliseconds)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the stack's data (logs, streams) in this folder")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hops-hare-parity-real-") as tmp:
        live = run_live(args.keep or Path(tmp), args.resend_s, args.batch_scale)
    sim = run_sim(live.run.leader_jobs, live.run.gpus)
    sim_h = sim_horizon(live.run.leader_jobs, live.run.gpus)
    same = {j.id: bitwise(spec_of(j, args.batch_scale), live.finals[j.id]) for j in WORKLOAD}
    report(live, sim, sim_h, same, args.batch_scale)
    print(f"HOPS_TASK_RESEND_S {args.resend_s:g} s; load average (1 min) at the start "
          f"{load:.1f}, at the end {os.getloadavg()[0]:.1f}, on {os.cpu_count()} CPUs")
    if not all(same.values()):
        raise SystemExit("a job's final parameters differ from the reference")


if __name__ == "__main__":
    main()
