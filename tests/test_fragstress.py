"""HiveD Figure 8's stress test (synthetic, experiments/cellfrag/stress.py): the
quota placer's two placements, and HiveD keeping an 8-GPU tenant's delay
exactly that of its private cluster as the workload's fragmentation varies."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.cellfrag.run import run_cell_fragmentation
from experiments.cellfrag.stress import QuotaPlacer, StressJob, StressSettings, replay, stress_jobs


def _job(i: int, tenant: str, gpus: int, at: float, run: float) -> StressJob:
    return StressJob(f"{tenant}-{i}", tenant, gpus, at, run)


def test_spread_one_gpu_jobs_block_a_node_sized_job_that_packing_admits() -> None:
    # Two nodes; tenant a (quota 8) runs two 1-GPU jobs; b (quota 8) then asks for 8.
    jobs = [_job(0, "a", 1, 0.0, 10.0), _job(1, "a", 1, 0.1, 10.0), _job(0, "b", 8, 0.2, 1.0)]
    quota = {"a": 8, "b": 8}
    packed = replay(jobs, QuotaPlacer(2, quota, "pack"), 2)
    spread = replay(jobs, QuotaPlacer(2, quota, "spread"), 2)
    assert packed.waits_h["b-0"] == 0.0  # a's jobs share one node, the other is free
    assert abs(spread.waits_h["b-0"] - 9.8) < 1e-9  # one per node: b waits for a's to end


def test_a_tenant_over_its_quota_waits_even_with_idle_gpus() -> None:
    jobs = [_job(0, "a", 8, 0.0, 2.0), _job(1, "a", 8, 0.0, 2.0)]
    run = replay(jobs, QuotaPlacer(2, {"a": 8}, "pack"), 2)
    assert sorted(run.waits_h.values()) == [0.0, 2.0]


def test_streams_keep_each_tenants_gpu_load_whatever_its_job_size() -> None:
    s = StressSettings(quotas={"x": 4, "y": 4}, days=20.0, mean_h=2.0)
    one = stress_jobs(s, set())
    eight = stress_jobs(s, {"x"})
    assert [j for j in one if j.tenant == "y"] == [j for j in eight if j.tenant == "y"]
    load = {n: sum(j.gpus * j.run_h for j in js if j.tenant == "x") / (20 * 24 * 32)
            for n, js in (("one", one), ("eight", eight))}
    assert abs(load["one"] - 0.9) < 0.1 and abs(load["eight"] - 0.9) < 0.25


def test_figure8_hived_keeps_the_wide_tenant_at_its_private_delay(tmp_path: Path) -> None:
    s = StressSettings(quotas={"res-f": 4, "prod-e": 2, "rest-a": 2}, steps=("res-f", "prod-e"),
                       days=2.0, mean_h=2.0)
    steps = run_cell_fragmentation(tmp_path, s)
    assert [st["wide"] for st in steps] == [["res-f"], ["prod-e", "res-f"]]
    assert steps[0]["workload_fragmentation"] > steps[1]["workload_fragmentation"]
    for st in steps:
        waits = st["avg_wait_h"]
        assert waits["hived"]["res-f"] == waits["private-pack"]["res-f"]
        assert st["unfinished"] == {k: 0 for k in st["unfinished"]}
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["synthetic"] is True and (tmp_path / "figure8.png").is_file()
    assert "synthetic" in (tmp_path / "results.md").read_text()
