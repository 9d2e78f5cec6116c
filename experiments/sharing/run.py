"""``hops experiment sharing``: HiveD against quotas and private clusters
(issue 20; HiveD §5.2), by the rules of docs/tenancy.md ("Rules").

The shell around the pure pieces: it reads the traces
(:mod:`experiments.sharing.workload`), derives quotas, cluster and cells
(:mod:`experiments.sharing.setup`, :mod:`experiments.sharing.cluster`), runs
every policy and each tenant's private cluster in the simulator, measures
(:mod:`experiments.sharing.metrics`) and writes ``results.json``,
``results.md``, ``cells.yaml``, ``cluster.yaml``, ``workload.json``, each
run's ``jobs.csv`` and the plots.
"""

from __future__ import annotations

import csv
import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from experiments.common.pool import HERE, Pool, run_all
from experiments.sharing.cluster import cluster_doc, sharing_cluster
from experiments.sharing.metrics import FragmentedSimulation, TenantMetrics, tenant_metrics
from experiments.sharing.metrics import utilisation as cluster_utilisation
from experiments.sharing.setup import TEMPLATE_CLUSTER, Setup, derive
from experiments.sharing.workload import tenant_jobs, tenant_of
from scheduling.cells import CellModel, cells_from_doc
from scheduling.policy import Policy
from scheduling.registry import PolicyError, make_policy, parse_policy
from scheduling.rounds import ROUND_S
from shared.cluster import Cluster
from shared.ids import JobId
from shared.job import R_NUM
from simulator.engine import Progress
from simulator.metrics import JobOutcome, SimResult
from simulator.settings import SimSettings
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

DEFAULT_TRACES = tuple(f"elasticflow-cluster0{i}" for i in range(1, 5))
DEFAULT_INNER = "hops:lam=inf"
ProgressFactory = Callable[[str], tuple[Progress | None, Callable[[], None]]]


def shared_specs(inner: str) -> dict[str, dict[str, object]]:
    """The policies run on the shared cluster (rule 7), as spec mappings."""
    return {
        "hived": {"name": "hived", "inner": inner, "opportunistic": False},
        "hived-opportunistic": {"name": "hived", "inner": inner, "opportunistic": True},
        "quota": {"name": "quota", "inner": inner},
        "quota-borrow": {"name": "quota-borrow", "inner": inner},
        "shared": {"name": inner},
    }


def build_policy(mapping: dict[str, object], cells: CellModel) -> Policy:
    """The policy of ``mapping`` with the tenants' cells (rule 6: one cell
    model for every tenant policy); a spec the registry does not know is a
    PolicyError."""
    spec = parse_policy(json.dumps(mapping)) if "inner" in mapping else parse_policy(
        str(mapping["name"]))
    return make_policy(spec, cells=cells)


def _r_num(text: str) -> int:
    return int(getattr(parse_policy(text), "r_num", R_NUM))


def _simulate(cluster: Cluster, jobs: Sequence[SimJob], policy: Policy, r_num: int,
              progress: Progress | None) -> tuple[SimResult, list[tuple[float, float]], float]:
    truth = GroundTruth(cluster, builtin_catalog())
    settings = SimSettings(round_s=ROUND_S, r_num=r_num)
    sim = FragmentedSimulation(cluster, jobs, policy, truth, settings, timer=time.perf_counter)
    start = time.perf_counter()
    result = sim.run(progress)
    return result, sim.fragmentation, time.perf_counter() - start


class RunOutcome(msgspec.Struct, frozen=True):
    result: SimResult
    fragmentation: list[tuple[float, float]]
    wall_s: float
    gpus: int


def run_private(setup: Setup, jobs: Sequence[SimJob], inner: str,
                progress: ProgressFactory | None) -> dict[str, RunOutcome]:
    """Rule 7's ``private``: each tenant alone on a cluster of exactly its
    cells, under the inner policy."""
    template = builtin_cluster(TEMPLATE_CLUSTER)
    out: dict[str, RunOutcome] = {}
    for tenant in setup.quota:
        mine = [j for j in jobs if str(j.spec.tenant) == tenant]
        if not mine:
            continue
        servers = [s for s in setup.cluster.servers if str(s.id) in setup.servers[tenant]]
        cluster = sharing_cluster(template, setup.gpu, [s.id for s in servers],
                                  f"private-{tenant}")
        update, close = progress(f"private {tenant}") if progress else (None, lambda: None)
        try:
            res, frag, wall = _simulate(cluster, mine, make_policy(inner), _r_num(inner), update)
        finally:
            close()
        out[tenant] = RunOutcome(res, frag, wall, cluster.total_gpus)
    return out


def _merge_private(runs: dict[str, RunOutcome]) -> dict[JobId, JobOutcome]:
    return {j.id: j for r in runs.values() for j in r.result.jobs}


def _prepare(traces: Sequence[str], first_n: int | None
             ) -> tuple[Setup, CellModel, list[SimJob]]:
    setup = derive(traces)
    cells = cells_from_doc(setup.cells, setup.cluster, "cells.yaml")
    truth = GroundTruth(setup.cluster, builtin_catalog())
    return setup, cells, tenant_jobs(setup.workload, truth, setup.cluster, setup.gpu, first_n)


def _run_one(label: str, traces: Sequence[str], first_n: int | None, inner: str,
             progress: ProgressFactory | None = None
             ) -> RunOutcome | dict[str, RunOutcome]:
    """One run of the experiment (``private``: every tenant's), from the
    traces alone, so that it can run in a worker process."""
    setup, cells, jobs = _prepare(traces, first_n)
    if label == "private":
        return run_private(setup, jobs, inner, progress)
    policy = build_policy(shared_specs(inner)[label], cells)
    update, close = progress(label) if progress else (None, lambda: None)
    try:
        res, frag, wall = _simulate(setup.cluster, jobs, policy, _r_num(inner), update)
    finally:
        close()
    return RunOutcome(res, frag, wall, setup.cluster.total_gpus)


def run_sharing(out: Path, traces: Sequence[str] = DEFAULT_TRACES, first_n: int | None = None,
                inner: str = DEFAULT_INNER, only: Sequence[str] | None = None,
                progress: ProgressFactory | None = None,
                pool: Pool = HERE) -> dict[str, dict[str, Any]]:
    """Run the experiment into ``out``; returns what ``results.json`` holds.
    ``only`` restricts the shared-cluster runs to those labels; a parallel
    ``pool`` runs the simulations at once, in worker processes or on Ray
    (without progress bars)."""
    parse_policy(inner)  # a bad inner spec fails before the work
    setup, cells, jobs = _prepare(traces, first_n)
    out.mkdir(parents=True, exist_ok=True)
    owner = tenant_of(jobs)
    _write_setup(out, setup, jobs, traces, first_n, inner)
    labels: list[str] = []
    pending: dict[str, str] = {}
    for label, mapping in shared_specs(inner).items():
        if only is not None and label not in only:
            continue
        try:
            build_policy(mapping, cells)
        except PolicyError as exc:
            pending[label] = str(exc)
            continue
        labels.append(label)
    done = _run_all(["private", *labels], traces, first_n, inner, progress, pool)
    private = done.pop("private")
    assert isinstance(private, dict)
    runs = {k: v for k, v in done.items() if isinstance(v, RunOutcome)}
    results = _results(runs, private, _merge_private(private), owner)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    # Beside it, not in it: results.json's top-level keys are the runs' labels.
    from experiments.common.provenance import provenance

    (out / "provenance.json").write_text(json.dumps(provenance(), indent=2) + "\n")
    _write_jobs(out, runs, private, owner)
    from experiments.common.plots import plot_sharing
    from experiments.sharing.report import render_sharing

    (out / "results.md").write_text(render_sharing(setup, results, pending, len(jobs),
                                                   first_n, inner))
    plot_sharing(results, {k: r.fragmentation for k, r in runs.items()}, out)
    return results


def _run_all(labels: Sequence[str], traces: Sequence[str], first_n: int | None, inner: str,
             progress: ProgressFactory | None, pool: Pool
             ) -> dict[str, RunOutcome | dict[str, RunOutcome]]:
    return run_all(pool, _run_one, {k: (k, list(traces), first_n, inner) for k in labels},
                   here=functools.partial(_run_one, progress=progress))


def _results(runs: dict[str, RunOutcome], private: dict[str, RunOutcome],
             merged: dict[JobId, JobOutcome], owner: dict[JobId, str]
             ) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for label, run in runs.items():
        results[label] = _entry(tenant_metrics(run.result.jobs, owner, merged, ROUND_S), run)
    every = [j for r in private.values() for j in r.result.jobs]
    per = tenant_metrics(every, owner, merged, ROUND_S)
    busy = sum(cluster_utilisation(r.result.rounds, r.result.jobs, r.gpus) * r.gpus
               for r in private.values())
    gpus = sum(r.gpus for r in private.values())
    results["private"] = {
        "tenants": {t: msgspec.to_builtins(m) for t, m in per.items()},
        "utilisation": busy / gpus if gpus else 0.0,
        "avg_fragmentation": None,
        "jobs_finished": sum(1 for j in every if j.finish is not None),
        "wall_s": sum(r.wall_s for r in private.values()),
    }
    return results


def _entry(per: dict[str, TenantMetrics], run: RunOutcome) -> dict[str, Any]:
    frag = [f for _, f in run.fragmentation]
    return {
        "tenants": {t: msgspec.to_builtins(m) for t, m in per.items()},
        "utilisation": cluster_utilisation(run.result.rounds, run.result.jobs, run.gpus),
        "avg_fragmentation": sum(frag) / len(frag) if frag else 0.0,
        "jobs_finished": sum(1 for j in run.result.jobs if j.finish is not None),
        "wall_s": run.wall_s,
    }


def _write_setup(out: Path, setup: Setup, jobs: Sequence[SimJob], traces: Sequence[str],
                 first_n: int | None, inner: str) -> None:
    (out / "cells.yaml").write_text(yaml.safe_dump(setup.cells, sort_keys=False))
    (out / "cluster.yaml").write_text(yaml.safe_dump(cluster_doc(setup.cluster),
                                                     sort_keys=False))
    w = setup.workload
    info = {
        "traces": list(traces), "first_n": first_n, "inner": inner, "gpu_type": setup.gpu,
        "period": {"start_s": w.start, "end_s": w.end, "days": w.period_s / 86400},
        "demands": [msgspec.to_builtins(d) for d in w.demands],
        "quota_cells": setup.quota, "servers": setup.cluster.total_gpus // 8,
        "gpus": setup.cluster.total_gpus, "jobs": len(jobs),
    }
    (out / "workload.json").write_text(json.dumps(info, indent=2) + "\n")


def _write_jobs(out: Path, runs: dict[str, RunOutcome], private: dict[str, RunOutcome],
                owner: dict[JobId, str]) -> None:
    tables = {label: run.result.jobs for label, run in runs.items()}
    tables["private"] = tuple(j for r in private.values() for j in r.result.jobs)
    for label, outcomes in tables.items():
        folder = out / label
        folder.mkdir(exist_ok=True)
        with (folder / "jobs.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["id", "tenant", "submit", "first_start", "finish", "wait_s",
                             "jct_s", "restarts", "gpus"])
            for j in outcomes:
                writer.writerow([j.id, owner[j.id], j.submit, j.first_start, j.finish,
                                 j.wait_s, j.jct_s, j.restarts, j.min_gpus])
