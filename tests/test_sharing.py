"""The sharing experiment (issue 20): multi-tenant workloads over the shared
period, the quota/cluster/cells rules of docs/tenancy.md, the anomalous-job
metric, and ``hops experiment sharing`` end to end on tiny traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from experiments.sharing.cluster import cells_doc, quota_cells, quotas, server_ids, sharing_cluster
from experiments.sharing.metrics import tenant_metrics
from experiments.sharing.workload import (
    TenantDemand,
    read_tenant_traces,
    shared_period,
    tenant_jobs,
)
from scheduling.cells import Allocation, Cells, cells_from_doc
from shared.ids import GpuType, JobId, ServerId
from shared.specs import SpecError
from simulator.metrics import JobOutcome
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration"
GPU = GpuType("GTX1080Ti")
TEMPLATE = builtin_cluster("paper-sim-512")


def _trace(path: Path, rows: list[tuple[str, int, int, int]], tenant: str | None = None) -> Path:
    """rows: (job id, submission time, num_gpu, duration)."""
    head = HEADER + (",tenant" if tenant is not None else "")
    lines = [head] + [
        f"{j},{t},100,resnet50,{t + 10_000},64,{g},{d}" + (f",{tenant}" if tenant else "")
        for j, t, g, d in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_several_traces_one_tenant_each_over_the_shared_period(tmp_path: Path) -> None:
    a = _trace(tmp_path / "alpha.csv", [("a0", 100, 1, 60), ("a1", 500, 8, 600),
                                        ("a2", 2_000, 2, 60)])
    b = _trace(tmp_path / "beta.csv", [("b0", 300, 4, 60), ("b1", 900, 1, 60),
                                       ("b2", 1_500, 16, 30), ("b3", 1_600, 1, 60)])
    w = read_tenant_traces([a, b])
    # [max(100, 300), min(2000, 1600)]: a0 (before) and a2 (after) are outside.
    assert (w.start, w.end) == (300, 1_600)
    assert w.tenants() == ("alpha", "beta")
    assert [d for d in w.demands if d.tenant == "alpha"] == [TenantDemand("alpha", 1, 4_800.0, 8)]
    assert [d for d in w.demands if d.tenant == "beta"] == [
        TenantDemand("beta", 4, 240.0 + 60.0 + 480.0 + 60.0, 16)]
    cluster = sharing_cluster(TEMPLATE, GPU, [ServerId(f"n{i}") for i in range(4)], "t")
    jobs = tenant_jobs(w, GroundTruth(cluster, builtin_catalog()), cluster, GPU)
    assert [(j.spec.id, j.spec.tenant, j.spec.submit_time) for j in jobs] == [
        ("beta/b0", "beta", 0.0), ("alpha/a1", "alpha", 200.0), ("beta/b1", "beta", 600.0),
        ("beta/b2", "beta", 1_200.0), ("beta/b3", "beta", 1_300.0)]
    assert [j.spec.requirements for j in jobs] == [(4,), (8,), (1,), (16,), (1,)]
    first = tenant_jobs(w, GroundTruth(cluster, builtin_catalog()), cluster, GPU, first_n=2)
    assert [j.spec.id for j in first] == ["beta/b0", "alpha/a1"]


def test_a_tenant_column_names_the_tenants(tmp_path: Path) -> None:
    path = tmp_path / "mixed.csv"
    lines = [HEADER + ",tenant",
             "x0,10,1,resnet50,99,64,1,60,nlp", "x1,20,1,resnet50,99,64,2,60,cv",
             "x2,30,1,resnet50,99,64,1,60,nlp", "x3,40,1,resnet50,99,64,1,60,cv"]
    path.write_text("\n".join(lines) + "\n")
    w = read_tenant_traces([path])
    assert (w.start, w.end) == (20, 30)  # cv from 20, nlp up to 30
    assert [(r.tenant, r.fields["job_id"]) for r in w.rows] == [("cv", "x1"), ("nlp", "x2")]


def test_traces_that_share_no_period_are_an_error(tmp_path: Path) -> None:
    a = _trace(tmp_path / "a.csv", [("a0", 0, 1, 60), ("a1", 10, 1, 60)])
    b = _trace(tmp_path / "b.csv", [("b0", 20, 1, 60)])
    with pytest.raises(SpecError, match="share no period"):
        read_tenant_traces([a, b])
    assert shared_period({"a": [5, 1, 9], "b": [3, 12]}) == (3, 9)


def test_quota_cluster_and_cells_follow_the_rules() -> None:
    day = 86_400.0
    demands = (
        TenantDemand("big", 10, 20.5 * day, 8),   # 20.5 GPUs on average -> 3 cells
        TenantDemand("wide", 2, 1.0 * day, 32),   # 1 GPU, but a 32-GPU job -> 4 cells
        TenantDemand("tiny", 1, 0.01 * day, 1),   # -> 1 cell
    )
    q = quotas(demands, day)
    assert q == {"big": 3, "wide": 4, "tiny": 1}
    assert quota_cells(TenantDemand("exact", 1, 16 * day, 8), day) == 2  # whole cells, no more
    servers = server_ids(q)
    every = [s for t in q for s in servers[t]]
    assert len(every) == len(set(every)) == 8  # the cluster is exactly the cells
    cluster = sharing_cluster(TEMPLATE, GPU, every, "sharing")
    assert cluster.total_gpus == 64 and {s.gpu_type for s in cluster.servers} == {GPU}
    model = cells_from_doc(cells_doc(GPU, q, every), cluster, "cells.yaml")
    cells = Cells(model)
    for tenant, n in q.items():
        view = cells.view(tenant)
        assert view.chains[0].reserved_gpus == 8 * n
        # Every reserved cell can hold a node-sized guaranteed job at once.
        for k in range(n):
            assert isinstance(cells.allocate(tenant, GPU, 8, f"{tenant}-{k}"), Allocation)
        assert not isinstance(cells.allocate(tenant, GPU, 1, f"{tenant}-more"), Allocation)
    assert cells.check_safety() == ()


def _outcome(job: str, wait_h: float, jct_h: float | None = 1.0) -> JobOutcome:
    return JobOutcome(id=JobId(job), model="m", submit=0.0, first_start=wait_h * 3600,
                      finish=None if jct_h is None else jct_h * 3600, wait_s=wait_h * 3600,
                      age_s=1.0, lr=0.0, jct_s=None if jct_h is None else jct_h * 3600,
                      restarts=0, min_gpus=1, max_gpus=1, r_avg=1.0)


def test_anomalous_jobs_waited_more_than_a_round_longer_than_in_private() -> None:
    round_s = 300.0
    private = {j.id: j for j in (_outcome("a1", 0.0), _outcome("a2", 1.0),
                                 _outcome("a3", 0.5), _outcome("b1", 2.0))}
    shared = [
        _outcome("a1", 300.0 / 3600, 1.1),   # exactly one round longer: not anomalous
        _outcome("a2", 1.0 + 301.0 / 3600),  # just over a round longer: anomalous
        _outcome("a3", 3.5, 4.0),            # 3 h longer: anomalous, the largest excess
        _outcome("b1", 0.5, 1.5),            # shorter than private
    ]
    owner = {JobId("a1"): "a", JobId("a2"): "a", JobId("a3"): "a", JobId("b1"): "b"}
    m = tenant_metrics(shared, owner, private, round_s)
    assert m["a"].jobs == 3 and m["a"].anomalous_jobs == 2
    assert math.isclose(m["a"].max_excess_wait_h, 3.0)
    assert math.isclose(m["a"].avg_wait_h, (300 / 3600 + 1 + 301 / 3600 + 3.5) / 3)
    assert math.isclose(m["a"].avg_jct_h, (1.1 + 1.0 + 4.0) / 3)
    assert m["b"].anomalous_jobs == 0 and m["b"].max_excess_wait_h == 0.0
    assert tenant_metrics(list(private.values()), owner, private, round_s)["a"].anomalous_jobs == 0


def test_hops_experiment_sharing_writes_results_of_the_documented_shape(tmp_path: Path) -> None:
    a = _trace(tmp_path / "ta.csv", [(f"a{i}", 60 * i, 8 if i % 3 == 0 else 1, 900)
                                     for i in range(12)])
    b = _trace(tmp_path / "tb.csv", [(f"b{i}", 30 + 60 * i, 1, 600) for i in range(12)])
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["experiment", "sharing", "--out", str(out),
                                      "--traces", f"{a},{b}", "--first-n", "16",
                                      "--no-progress", "--workers", "2"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"hived", "hived-opportunistic", "quota", "quota-borrow", "shared",
                            "private"}
    keys = {"jobs", "avg_wait_h", "avg_jct_h", "anomalous_jobs", "max_excess_wait_h"}
    for policy, entry in results.items():
        assert set(entry["tenants"]) == {"ta", "tb"}, policy
        assert all(set(m) == keys for m in entry["tenants"].values())
        assert sum(m["jobs"] for m in entry["tenants"].values()) == 16
        assert 0.0 <= entry["utilisation"] <= 1.0
    assert all(m["anomalous_jobs"] == 0 for m in results["private"]["tenants"].values())
    workload = json.loads((out / "workload.json").read_text())
    # The period is [30, 660]. ta: 11 jobs (a0 is before it), 3 of 8 GPUs and 8 of 1,
    # 900 s each: 32 * 900 / 630 = 45.7 GPUs -> 6 cells; tb: 11 * 600 / 630 = 10.5 -> 2.
    assert (workload["period"]["start_s"], workload["period"]["end_s"]) == (30, 660)
    assert workload["quota_cells"] == {"ta": 6, "tb": 2} and workload["gpus"] == 8 * 8
    for name in ("results.md", "tenant_wait.png", "fragmentation.png", "cells.yaml"):
        assert (out / name).is_file()
