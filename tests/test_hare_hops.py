"""Hare's relaxed-sync workload as ordinary synchronous jobs in the main
simulator (:mod:`experiments.hare.sync`) and its hook in ``hops experiment hare``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.hare.run import HareExperiment, simulate_sync, workload
from experiments.hare.run import run as run_experiment
from experiments.hare.sync import (
    SYNC_POLICIES,
    is_sync_policy,
    run_jobs,
    speed_rows,
    sync_cluster,
    sync_job,
    task_result,
)
from scheduling.policies.hare.model import TaskJob
from shared.ids import GpuType, JobId
from simulator.metrics import JobOutcome as SimOutcome
from simulator.tasks_result import JobOutcome, summarise
from world.catalog import gavel_catalog
from world.hare import CLUSTERS, cluster_shape, task_models

SMALL = HareExperiment(jobs=20, clusters=("testbed",), policies=("hops",))


def test_the_conversion_keeps_each_jobs_work_arrival_and_scale() -> None:
    catalog = gavel_catalog()
    jobs, _ = workload(HareExperiment(jobs=100), "mixed-160")
    for job in jobs:
        sim = sync_job(job, catalog)
        m = catalog[job.model]
        assert sim.model == job.model == sim.spec.model
        assert sim.spec.id == job.id
        assert sim.spec.submit_time == job.arrival_s  # exactly, no rounding
        assert sim.spec.total_samples == job.rounds * job.tasks_per_round * m.batch_size
        assert sim.spec.requirement_set() == (job.tasks_per_round,)
        assert sim.spec.sync_scale == 0  # plain synchronous data parallel


@pytest.mark.parametrize("name", list(CLUSTERS))
@pytest.mark.parametrize("server_gpus", [4, 8])
def test_the_cluster_has_the_task_clusters_gpus(name: str, server_gpus: int) -> None:
    shape = cluster_shape(name)
    cluster = sync_cluster(shape, server_gpus)
    for t, n in shape.items():
        assert cluster.type_gpus(t) == n
        assert all(s.gpus <= server_gpus for s in cluster.servers_of_type(t))
    assert cluster.total_gpus == sum(shape.values())


def test_both_worlds_take_the_same_single_gpu_speed() -> None:
    """T^c of world.hare is the main ground truth's one-GPU speed; more GPUs
    differ (Gavel's measured scaling against Hare's parameter server)."""
    rows = speed_rows(task_models(), cluster_shape("testbed"))
    assert rows
    for r in rows:
        assert r.one_gpu_sync == pytest.approx(r.one_gpu_task, rel=1e-12)
    # An 8-GPU LM job spans two 4-GPU servers: Gavel measured it far slower
    # than the parameter-server round of the task model.
    lm8 = next(r for r in rows if r.model == "gavel:LM (batch size 80)"
               and r.gpu_type == "V100" and r.scale == 8)
    assert lm8.servers == 2 and lm8.ratio < 0.5


def test_a_tiny_run_finishes_every_job_under_hops() -> None:
    jobs, _ = workload(SMALL, "testbed")
    run = simulate_sync(SMALL, "testbed", "hops")
    assert [j.id for j in run.result.jobs] == [j.id for j in jobs]
    for job, done, life in zip(jobs, run.result.jobs, run.jobs, strict=True):
        assert done.arrival_s == job.arrival_s
        assert done.tasks == job.rounds * job.tasks_per_round
        assert job.arrival_s < life.first_start_s < done.finish_s
        assert life.starts >= 1 and life.gpu_type in cluster_shape("testbed")
    assert run.result.share_done_25min <= 1.0 and run.result.makespan_h > 0


def test_metrics_are_the_task_simulators_computation() -> None:
    """Two jobs by hand: arrivals 0 and 600 s, finishes 1200 and 4200 s,
    weights 1 and 2: JCTs 1200 and 3600 s."""
    jobs = [TaskJob(JobId("a"), 0.0, 10, 2, {GpuType("V100"): 1.0}, weight=1.0),
            TaskJob(JobId("b"), 600.0, 5, 1, {GpuType("V100"): 1.0}, weight=2.0)]
    outcomes = [_outcome("b", 600.0, 4200.0), _outcome("a", 0.0, 1200.0)]
    result = task_result("hops", jobs, outcomes, (0.5, 0.25))
    assert result.weighted_jct_h == pytest.approx((1200 + 2 * 3600) / 3600)
    assert result.avg_jct_h == pytest.approx((1200 + 3600) / 2 / 3600)
    assert result.makespan_h == pytest.approx(4200 / 3600)
    assert result.share_done_25min == 0.5  # 1200 s <= 25 min < 3600 s
    assert result.metrics()["plan_total_s"] == 0.75
    same = summarise("hops", (JobOutcome(JobId("a"), 0.0, 1200.0, 1.0, 20),
                              JobOutcome(JobId("b"), 600.0, 4200.0, 2.0, 5)), (0.5, 0.25))
    assert result == same


def test_an_unfinished_job_is_an_error() -> None:
    jobs = [TaskJob(JobId("a"), 0.0, 10, 2, {GpuType("V100"): 1.0})]
    with pytest.raises(RuntimeError, match="did not finish"):
        task_result("hops", jobs, [_outcome("a", 0.0, None)], ())


def test_a_lone_job_pays_profiling_restart_and_its_measured_speed() -> None:
    """One ResNet-50 job on 4 V100 of one server: it runs at Gavel's
    measured 4-GPU speed after profiling, with ResNet-50's 250 s restart."""
    model = "gavel:ResNet-50 (batch size 64)"
    m = task_models()[model]
    job = TaskJob(JobId("r"), 0.0, 2000, 4, dict(m.compute_s), dict(m.sync_s), model=model)
    run = run_jobs([job], {GpuType("V100"): 4}, "hops")
    life = run.jobs[0]
    run_s = 2000 * 4 * 64 / (4 * gavel_catalog()[model].by_type[GpuType("V100")]
                             .consolidated[4])
    assert life.starts == 1
    assert life.finish_s - life.first_start_s == pytest.approx(250.0 + run_s, rel=1e-6)


def test_the_task_speed_control_runs_hares_round_time() -> None:
    """The same 8-GPU LM job with Hare's round times: T^c + T^s per step
    on V100, over two servers all the same; LM's restart is 30 s."""
    model = "gavel:LM (batch size 80)"
    m = task_models()[model]
    job = TaskJob(JobId("l"), 0.0, 20000, 8, dict(m.compute_s), dict(m.sync_s), model=model)
    v100 = {GpuType("V100"): 8}
    task = run_jobs([job], v100, "hops", speed="task").jobs[0]
    assert task.finish_s - task.first_start_s == pytest.approx(
        30.0 + 20000 * m.round_s(GpuType("V100")), rel=1e-6)
    measured = run_jobs([job], v100, "hops").jobs[0]
    assert measured.finish_s - measured.first_start_s > 2 * (task.finish_s - task.first_start_s)
    free = run_jobs([job], v100, "hops", speed="task", restart_s=0.0).jobs[0]
    assert task.finish_s - free.finish_s == pytest.approx(30.0, rel=1e-6)


def test_the_experiment_runs_hops_beside_the_task_policies(tmp_path: Path) -> None:
    exp = HareExperiment(jobs=20, clusters=("testbed",), policies=("hare-eft", "hops", "gavel"))
    assert all(is_sync_policy(p) for p in SYNC_POLICIES) and "hops" in HareExperiment().policies
    results = run_experiment(tmp_path, exp)
    for policy in exp.policies:
        m = results["testbed"][policy]
        assert {"weighted_jct_h", "avg_jct_h", "makespan_h", "share_done_25min"} <= set(m)
        assert math.isfinite(m["weighted_jct_h"]) and m["weighted_jct_h"] > 0
    assert json.loads((tmp_path / "results.json").read_text()) == results
    per_job = json.loads((tmp_path / "jobs.json").read_text())["testbed"]
    assert per_job["hops"].keys() == per_job["hare-eft"].keys()
    assert "| hops |" in (tmp_path / "results.md").read_text()


def test_unknown_policies_fail_early() -> None:
    assert is_sync_policy("hops:lam=inf") and not is_sync_policy("hare")
    with pytest.raises(ValueError):
        HareExperiment(policies=("hops:nonsense=1",))
    with pytest.raises(ValueError):
        HareExperiment(policies=("sia",))


def _outcome(job: str, submit: float, finish: float | None) -> SimOutcome:
    return SimOutcome(
        id=JobId(job), model="m", submit=submit, first_start=submit, finish=finish,
        wait_s=0.0, age_s=1.0, lr=0.0,
        jct_s=None if finish is None else finish - submit, restarts=1,
        min_gpus=1, max_gpus=1, r_avg=1.0)
