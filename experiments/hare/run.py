"""``hops experiment hare``: Hare against its baselines (hare.md §7), on the
task-level simulator (:mod:`simulator.tasks`).

Clusters (:data:`world.hare.DEFAULT_CLUSTERS`): the 15-GPU testbed of §7.1
on the nearest available types, a 160-GPU K80/P100/V100 cluster (§7.3's 160
GPUs, Figs. 14-15) and 160 V100 (Fig. 16's low heterogeneity level, where
§7.3 finds Hare and Sched_Homo close); ``v100-k80-160`` (Fig. 16's middle
level) on request. Policies: ``hare``, ``hare-eft`` and the
baselines ``gavel-fifo``, ``srtf``, ``homo``, ``allox``
(:func:`scheduling.registry.make_task_policy`); and ``hops`` and
``gavel``, the round-based policies of the registry, which run the same jobs
as ordinary synchronous jobs through the main simulator
(:mod:`experiments.hare.sync`).

Workloads (:mod:`experiments.hare.workload`): ``jobs`` jobs on each 160-GPU
cluster (the same jobs and arrivals on both, drawn from ``seed``), and on the
testbed the same share per GPU, ``jobs x 15 / 160`` (at least 4), drawn from
the same seed.

Writes ``results.json`` ({cluster: {policy: {"weighted_jct_h",
"avg_jct_h", "makespan_h", "share_done_25min", "plan_total_s", ...}}}),
``jobs.json`` (each job's JCT in seconds, {cluster: {policy: {job: jct}}}),
``setup.json`` (the settings, the workloads' sizes and the provenance:
commit, Python, solver and numpy versions, as ``hops experiment coda``
records it), ``results.md`` and a JCT CDF per cluster (Fig. 13).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from experiments.common.pool import HERE, Pool, run_all
from experiments.common.suite import markdown_table
from experiments.hare.sync import SyncRun, is_sync_policy, run_jobs
from experiments.hare.workload import HareWorkload, cluster_gpus, generate
from scheduling.policies.hare.macro import DEFAULT_BUDGET
from scheduling.policies.hare.model import Gpu, TaskJob
from scheduling.registry import DEFAULT_POLICY, TASK_POLICIES, make_task_policy, parse_policy
from simulator.tasks import TaskSimSettings, simulate
from simulator.tasks_result import TaskSimResult
from world.hare import DEFAULT_CLUSTERS, SWITCH_S, cluster_shape, task_models

BIG_GPUS = 160  # the 160-GPU clusters that ``jobs`` is stated for (§7.3)
MIN_JOBS = 4


class HareExperiment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one ``hops experiment hare`` compares (module docstring);
    ``budget``: macro-tasks per problem at most (macro.py)."""

    jobs: int = 200
    seed: int = 0
    clusters: tuple[str, ...] = DEFAULT_CLUSTERS
    policies: tuple[str, ...] = (*TASK_POLICIES, DEFAULT_POLICY)
    budget: int = DEFAULT_BUDGET
    load: float = 1.0
    switch_s: float = SWITCH_S
    horizon: int | None = None  # the task policies' rounds per revision (None: all)

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError("jobs must be >= 1")
        if self.horizon is not None and self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        for name in self.clusters:
            cluster_shape(name)  # an unknown cluster fails before the first run
        for name in self.policies:
            if is_sync_policy(name):
                parse_policy(name)  # a bad setting fails before the first run
            else:
                make_task_policy(name)


def jobs_on(exp: HareExperiment, gpus: int) -> int:
    """The jobs of a cluster of ``gpus`` GPUs: ``exp.jobs`` per 160 GPUs."""
    return max(MIN_JOBS, round(exp.jobs * gpus / BIG_GPUS))


def workload(exp: HareExperiment, cluster: str) -> tuple[tuple[TaskJob, ...], tuple[Gpu, ...]]:
    """The jobs and GPUs of ``cluster``; the same seed for every cluster, so
    equal-sized clusters get the same jobs."""
    gpus = cluster_gpus(cluster_shape(cluster))
    spec = HareWorkload(jobs=jobs_on(exp, len(gpus)), load=exp.load)
    jobs = generate(spec, task_models(), len(gpus), np.random.default_rng(exp.seed))
    return jobs, gpus


def simulate_sync(exp: HareExperiment, cluster: str, policy: str) -> SyncRun:
    """``policy`` (:data:`~experiments.hare.sync.SYNC_POLICIES`) on
    ``cluster``'s jobs of ``exp``, the task policies' jobs, as synchronous
    jobs (:mod:`experiments.hare.sync`)."""
    jobs, _ = workload(exp, cluster)
    return run_jobs(jobs, cluster_shape(cluster), policy, seed=exp.seed)


def simulate_one(exp: HareExperiment, cluster: str, policy: str) -> TaskSimResult:
    """One run (a worker process's whole task)."""
    if is_sync_policy(policy):
        return simulate_sync(exp, cluster, policy).result
    jobs, gpus = workload(exp, cluster)
    settings = TaskSimSettings(budget=exp.budget, switch_s=exp.switch_s,
                               horizon_rounds=exp.horizon)
    return simulate(jobs, gpus, make_task_policy(policy), settings, timer=time.perf_counter)


def run(out: Path, exp: HareExperiment, pool: Pool = HERE,
        progress: Callable[[str], None] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Every policy on every cluster; the results, written under ``out``."""
    from experiments.common.provenance import provenance

    pairs = [(c, p) for c in exp.clusters for p in exp.policies]
    started = time.perf_counter()

    def done(pair: tuple[str, str]) -> None:
        if progress:
            progress(f"{pair[0]}/{pair[1]}: {time.perf_counter() - started:.0f} s")

    runs = run_all(pool, simulate_one, {pair: (exp, *pair) for pair in pairs}, done)
    results = {c: {p: runs[(c, p)].metrics() for p in exp.policies} for c in exp.clusters}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    per_job = {c: {p: {j.id: j.jct_s for j in runs[(c, p)].jobs} for p in exp.policies}
               for c in exp.clusters}
    (out / "jobs.json").write_text(json.dumps(per_job, indent=2) + "\n")
    sizes: dict[str, dict[str, object]] = {}
    for c in exp.clusters:
        jobs, gpus = workload(exp, c)
        sizes[c] = {"gpus": len(gpus), "jobs": len(jobs),
                    "shape": {str(t): n for t, n in cluster_shape(c).items()}}
    setup = {"experiment": msgspec.to_builtins(exp), "clusters": sizes,
             "wall_s": time.perf_counter() - started, "provenance": provenance()}
    (out / "setup.json").write_text(json.dumps(setup, indent=2) + "\n")
    (out / "results.md").write_text(markdown(exp, results, sizes))
    _plots(out, exp, runs)
    return results


COLUMNS = (
    ("weighted_jct_h", "Weighted JCT (h)", "{:.2f}"),
    ("avg_jct_h", "Avg JCT (h)", "{:.3f}"),
    ("makespan_h", "Makespan (h)", "{:.2f}"),
    ("share_done_25min", "Done <= 25 min", "{:.0%}"),
    ("plan_total_s", "Planning (s)", "{:.1f}"),
    ("plan_max_s", "Plan max (s)", "{:.3f}"),
)


def markdown(exp: HareExperiment, results: dict[str, dict[str, dict[str, float]]],
             sizes: dict[str, dict[str, object]]) -> str:
    lines = ["# Hare against its baselines (hare.md §7)", "",
             f"Seed {exp.seed}, macro-task budget {exp.budget}, offered load {exp.load:g}, "
             f"switch cost {exp.switch_s * 1000:g} ms.", ""]
    if any(is_sync_policy(p) for p in exp.policies):
        lines += ["hops and gavel run the same jobs as synchronous jobs of S GPUs in the "
                  "main simulator (experiments/hare/sync.py): profiling, 300 s rounds, "
                  "checkpoint-restarts; their planning time is the round planner's.", ""]
    for cluster, by_policy in results.items():
        size = sizes[cluster]
        lines += [f"## {cluster}: {size['gpus']} GPUs {size['shape']}, {size['jobs']} jobs", "",
                  *markdown_table("policy", COLUMNS, by_policy), "",
                  *_comparisons(by_policy), ""]
    return "\n".join(lines)


def _comparisons(by_policy: dict[str, dict[str, float]]) -> list[str]:
    """Hare's weighted JCT against each baseline's (§7.2: 47.6-75.3% less)."""
    out: list[str] = []
    for hare in ("hare", "hare-eft"):
        if hare not in by_policy:
            continue
        mine = by_policy[hare]["weighted_jct_h"]
        for other, m in by_policy.items():
            if other.startswith("hare") or m["weighted_jct_h"] <= 0:
                continue
            ratio = mine / m["weighted_jct_h"]
            out.append(f"- {hare}'s weighted JCT is {ratio:.3f}x {other}'s "
                       f"({1.0 - ratio:+.1%} reduction)")
    return out


def _plots(out: Path, exp: HareExperiment, runs: dict[tuple[str, str], TaskSimResult]) -> None:
    """One CDF of the jobs' JCT per cluster (Fig. 13)."""
    from experiments.common.plots import cdf_plot

    for cluster in exp.clusters:
        series = {p: [j.jct_s / 60.0 for j in runs[(cluster, p)].jobs] for p in exp.policies}
        cdf_plot(series, f"{cluster}: JCT (min)", out / f"jct_cdf_{cluster}.png")
