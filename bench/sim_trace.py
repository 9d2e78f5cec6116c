"""Per-job trace of one ``hops experiment traces`` run: every start and stop
with its GPU type, server, ground-truth speed and cause.

Runs one policy on the first N jobs of one ElasticFlow trace, compressed by
the rule of :mod:`experiments.traces.load` exactly as ``hops experiment
traces`` does, and writes ``events.csv`` (one row per start or stop) and
``jobs.csv`` (one row per job: the GPU-seconds it held on each type, its
restarts by cause, how fast its configurations ran against its best
one-GPU speed) to OUT; with ``--priorities``, ``priorities.csv`` too: at
each round's first plan, each estimated job's latency ratio (Eq. 8) and
queue priority under the policy's ``priority`` setting (``lr`` when it has
none), recomputed from the plan's snapshot as the policies compute them
(``queue_priorities``). A stop is classed by what the round's first plan
did with the job: ``dropped`` (no configuration: preempted), ``resized``
(another GPU count) or ``moved`` (the same count elsewhere).

    PYTHONPATH=$PWD python -m bench.sim_trace --trace elasticflow-cluster01 \
        --first-n 300 --policy hops --out out/trace-c01-hops
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec

from experiments.common.simrun import RunSpec, prepare
from experiments.traces.load import compression
from scheduling.policy import Policy
from scheduling.priorities import latency_ratio, priority_fn, queue_facts
from scheduling.registry import (
    CLUSTER_TYPES,
    PolicySpec,
    make_policy,
    profile_reuse,
    resolve,
    spec_text,
)
from shared.configuration import Configuration
from shared.snapshot import Plan, Snapshot
from simulator.engine import Simulation
from simulator.metrics import summarize
from simulator.settings import SimSettings
from simulator.state import JobRecord
from simulator.workloads import trace_reference


class TracedSimulation(Simulation):
    """The simulator, logging each start and stop."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.log: list[dict[str, object]] = []
        self._chosen: dict[str, Configuration] = {}
        self._first = False
        self._types = {s.id: s.gpu_type for s in self.cluster.servers}
        self._model = {s.id: s.model for s in self.cluster.servers}

    def _apply(self, plan, first):  # type: ignore[no-untyped-def]
        self._chosen = {a.job_id: a.config for a in plan.assignments}
        self._first = first
        super()._apply(plan, first)

    def _describe(self, rec: JobRecord, config: Configuration) -> dict[str, object]:
        types = sorted({self._types[s] for s, _ in config.parts})
        return {"types": "+".join(types), "servers": "+".join(f"{s}:{g}" for s, g in config.parts),
                "server_model": "+".join(sorted({self._model[s] for s, _ in config.parts})),
                "gpus": config.total_gpus,
                "truth_rate": self.truth.throughput(rec.model, config)}

    def _stop(self, rec: JobRecord) -> None:
        old = rec.current
        new = self._chosen.get(rec.id)
        cause = ("dropped" if new is None else
                 "resized" if new.total_gpus != old.total_gpus else "moved")
        row = {"t": self.now, "job": rec.id, "event": "stop", "cause": cause,
               "first_plan": self._first, **self._describe(rec, old)}
        if new is not None:
            row["to"] = self._describe(rec, new)["types"]
            row["to_gpus"] = new.total_gpus
        self.log.append(row)
        super()._stop(rec)

    def _start(self, rec: JobRecord, config: Configuration) -> None:
        restart = rec.phase != "running"
        super()._start(rec, config)
        if restart:
            self.log.append({"t": self.now, "job": rec.id, "event": "start", "cause": "",
                             "first_plan": self._first, **self._describe(rec, config)})

    def _complete(self, rec: JobRecord) -> None:
        self.log.append({"t": self.now, "job": rec.id, "event": "finish", "cause": "",
                         "first_plan": False, **self._describe(rec, rec.current)})
        super()._complete(rec)


class PriorityLog:
    """``inner``, recording each first plan's latency ratios and priorities
    (it changes no plan)."""

    def __init__(self, inner: Policy, priority: str, r_num: int) -> None:
        self.inner, self.fn, self.r_num = inner, priority_fn(priority), r_num
        self.rows: list[tuple[object, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def plan(self, snap: Snapshot) -> Plan:
        if snap.first_plan:  # the jobs and facts the policies queue with
            jobs = {j.id: j for j in snap.jobs if j.spec.kind != "cpu"
                    and j.phase != "profiling" and j.id in snap.estimates}
            facts = queue_facts(snap, jobs, self.r_num)
            for jid, j in jobs.items():
                f = facts[jid]
                self.rows.append((snap.now, jid, j.phase, j.current.total_gpus if j.current else 0,
                                  round(latency_ratio(j, f), 4), round(self.fn(j, f), 5),
                                  round(f.remaining_s, 1), round(f.age_s, 1), round(j.wait_s, 1)))
        return self.inner.plan(snap)


def queue_rule(spec: PolicySpec) -> str:
    """The priority rule (``priority``) of the cluster policy ``spec`` is or
    wraps; SystemExit for one that orders its queue its own way."""
    cluster = spec
    while not isinstance(cluster, CLUSTER_TYPES):
        inner = getattr(cluster, "inner_spec", None)
        if inner is None:
            raise SystemExit(f"--priorities: {spec_text(spec)} wraps no cluster policy")
        cluster = inner
    rule = getattr(cluster, "priority", None)
    if not isinstance(rule, str):
        raise SystemExit(f"--priorities: {spec_text(cluster)} orders its queue its own way")
    return rule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="elasticflow-cluster01")
    ap.add_argument("--first-n", type=int, default=300)
    ap.add_argument("--policy", default="hops")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--priorities", action="store_true",
                    help="also write priorities.csv (each first plan's ratios and priorities)")
    a = ap.parse_args()

    base = RunSpec(cluster="paper-sim-512", workload=a.trace, seed=a.seed, first_n=a.first_n)
    cluster, truth, jobs = prepare(base)
    factor = compression(jobs, truth, cluster, trace_reference(cluster, truth))
    spec = msgspec.structs.replace(base, policy=a.policy, compress=factor)
    pspec = resolve(spec.policy)
    cluster, truth, jobs = prepare(spec)
    settings = SimSettings(round_s=spec.round_s, seed=spec.seed, r_num=pspec.r_num,
                           profile_reuse=profile_reuse(pspec))
    policy = make_policy(pspec)
    logged = PriorityLog(policy, queue_rule(pspec), pspec.r_num) if a.priorities else None
    sim = TracedSimulation(cluster, jobs, logged or policy, truth, settings,
                           timer=time.perf_counter)
    t0 = time.perf_counter()
    result = sim.run()
    wall = time.perf_counter() - t0

    a.out.mkdir(parents=True, exist_ok=True)
    keys = ["t", "job", "event", "cause", "first_plan", "types", "servers", "server_model",
            "gpus", "truth_rate", "to", "to_gpus"]
    with (a.out / "events.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(sim.log)

    # Per job: GPU-seconds held per type, rate relative to its best 1-GPU rate.
    best1: dict[str, tuple[float, str]] = {}
    for j in jobs:
        if j.model not in best1:
            best1[j.model] = max(
                (truth.throughput(j.model, Configuration.of({s.id: 1})), s.gpu_type)
                for s in cluster.servers if truth.supports(j.model, s.gpu_type))
    open_: dict[str, tuple[float, dict[str, object]]] = {}
    held: dict[str, Counter[str]] = defaultdict(Counter)
    rate_time: dict[str, float] = defaultdict(float)  # sum of rate/best1 * seconds (1-GPU runs)
    run_time: dict[str, float] = defaultdict(float)
    causes: dict[str, Counter[str]] = defaultdict(Counter)
    for row in sim.log:
        job = str(row["job"])
        if row["event"] == "start":
            open_[job] = (float(row["t"]), row)  # type: ignore[arg-type]
        else:
            t0_, started = open_.pop(job)
            dt = float(row["t"]) - t0_  # type: ignore[arg-type]
            held[job][str(started["types"])] += dt * int(started["gpus"])  # type: ignore[arg-type]
            if started["gpus"] == 1:
                rate_time[job] += dt * float(started["truth_rate"]) / best1[
                    next(j.model for j in jobs if j.spec.id == job)][0]  # type: ignore[arg-type]
                run_time[job] += dt
            if row["event"] == "stop":
                causes[job][str(row["cause"])] += 1
    outcomes = {o.id: o for o in result.jobs}
    with (a.out / "jobs.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "model", "min_gpus", "max_gpus", "jct_s", "wait_s", "restarts",
                    "dropped", "resized", "moved", "held_by_type", "best1_type",
                    "rel_speed_1gpu"])
        for j in jobs:
            o = outcomes[j.spec.id]
            w.writerow([j.spec.id, j.model, o.min_gpus, o.max_gpus, o.jct_s, o.wait_s, o.restarts,
                        causes[j.spec.id]["dropped"], causes[j.spec.id]["resized"],
                        causes[j.spec.id]["moved"],
                        json.dumps(dict(held[j.spec.id])), best1[j.model][1],
                        rate_time[j.spec.id] / run_time[j.spec.id] if run_time[j.spec.id] else ""])
    if logged is not None:
        with (a.out / "priorities.csv").open("w", newline="") as fh:
            rows = csv.writer(fh)
            rows.writerow(["t", "job", "phase", "gpus", "latency_ratio", "priority",
                           "remaining_s", "age_s", "wait_s"])
            rows.writerows(logged.rows)
    summary = {k: v for k, v in summarize(result, cluster).items()}
    summary["compress"] = factor
    summary["wall_s"] = wall
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps({k: summary[k] for k in list(summary)[:14]}, indent=1, default=str))


if __name__ == "__main__":
    main()
