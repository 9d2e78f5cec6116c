"""Run the simulator from the command line and write what it measured.

The imperative shell around :mod:`simulator.engine`: it resolves names to a
cluster, a workload and a policy, injects the wall clock for planner timing,
shows progress, and writes ``summary.json``, ``jobs.csv`` and ``rounds.csv``.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from experiments.common.floor import floor
from scheduling.registry import DEFAULT_POLICY, make_policy, profile_reuse, resolve
from scheduling.rounds import ROUND_S
from shared.cluster import Cluster
from simulator.engine import Progress, Simulation
from simulator.metrics import SimResult, summarize
from simulator.settings import SimSettings
from simulator.workloads import SimJob, load_workload
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.truth import GroundTruth


class RunSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything that determines one simulation run."""

    cluster: str
    workload: str
    policy: str = DEFAULT_POLICY  # a spec: a name, or name:setting=value,... (registry)
    priority: str | None = None  # overrides the spec's, when given
    lam: float | None = None  # overrides the spec's, when given
    seed: int = 0
    first_n: int | None = None
    compress: float = 1.0
    elastic: bool = False
    rate_per_h: float | None = None
    round_s: float = ROUND_S
    restart_s: float | None = None  # None: each model's own (world.restarts)


def prepare(spec: RunSpec) -> tuple[Cluster, GroundTruth, list[SimJob]]:
    cluster = cluster_arg(spec.cluster)
    truth = GroundTruth(cluster, builtin_catalog())
    jobs = load_workload(
        spec.workload,
        cluster=cluster,
        truth=truth,
        seed=spec.seed,
        first_n=spec.first_n,
        compress=spec.compress,
        elastic=spec.elastic,
        rate_per_h=spec.rate_per_h,
    )
    return cluster, truth, jobs


def simulate(spec: RunSpec, progress: Progress | None = None) -> tuple[Cluster, SimResult]:
    """Run ``spec``; the result carries each job's JCT floor (``floor_s``,
    experiments/common/floor.py), which :func:`simulator.metrics.summarize` reports."""
    policy_spec = resolve(spec.policy, priority=spec.priority, lam=spec.lam)
    policy = make_policy(policy_spec)  # a bad spec: before the work
    cluster, truth, jobs = prepare(spec)
    # The simulator checks plans against the requirement sets the policy
    # plans with, so it takes the policy's own R_num.
    settings = SimSettings(round_s=spec.round_s, restart_s=spec.restart_s, seed=spec.seed,
                           r_num=policy_spec.r_num, profile_reuse=profile_reuse(policy_spec))
    sim = Simulation(cluster, jobs, policy, truth, settings, timer=time.perf_counter)
    result = sim.run(progress)
    return cluster, msgspec.structs.replace(result, floor_s=floor(jobs, truth, cluster))


def write_outputs(
    out: Path, spec: RunSpec, cluster: Cluster, result: SimResult
) -> dict[str, object]:
    from experiments.common.provenance import provenance

    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {**summarize(result, cluster), "run": msgspec.to_builtins(spec),
                                  "provenance": provenance()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _write_csv(out / "jobs.csv", [msgspec.to_builtins(j) for j in result.jobs])
    _write_csv(out / "rounds.csv", [msgspec.to_builtins(r) for r in result.rounds])
    # Each job's reason history: [[time, code], ...] per job id.
    (out / "reasons.json").write_bytes(msgspec.json.encode(result.reasons) + b"\n")
    return summary


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    with path.open("w", newline="") as fh:
        if not rows:
            return
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def rich_progress(label: str) -> tuple[Progress, Callable[[], None]]:
    """A progress bar over jobs done, showing simulated time; returns the
    callback and a function that closes the bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    bar = Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sim {task.fields[sim_h]:.1f} h"),
        TimeElapsedColumn(),
        transient=True,
    )
    task = bar.add_task(label, total=None, sim_h=0.0)
    bar.start()
    last = [0.0]

    def update(now: float, done: int, total: int) -> None:
        # Redrawing on every event would cost more than the simulation.
        if done == total or now - last[0] >= 600.0:
            last[0] = now
            bar.update(task, completed=done, total=total, sim_h=now / 3600)

    return update, bar.stop
