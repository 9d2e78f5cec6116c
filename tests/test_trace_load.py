"""The rule that sets the ElasticFlow traces' load (experiments/traces/load.py):
offered load is the GPU-seconds asked over the arrival span in units of the
cluster's GPUs, and the compression brings it to 1.35x, never spreading a
trace out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from experiments.tables.define import define
from experiments.traces.load import TARGET, compression, demand_gpu_s, offered_load
from shared.ids import JobId
from shared.job import JobSpec
from simulator.workloads import SimJob, packed, trim
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

CLUSTER = builtin_cluster("paper-sim-512")
TRUTH = GroundTruth(CLUSTER, builtin_catalog())
MODEL = "resnet18-cifar10"
REF = CLUSTER.gpu_types[0].name


def job(i: int, gpus: int, hours: float, at_h: float) -> SimJob:
    rate = TRUTH.throughput(MODEL, packed(CLUSTER, REF, gpus))
    m = builtin_catalog()[MODEL]
    spec = JobSpec(JobId(f"j{i}"), MODEL, m.batch_size, m.params, round(rate * hours * 3600),
                   requirements=(gpus,), submit_time=at_h * 3600)
    return SimJob(spec, MODEL)


def test_offered_load_is_gpu_time_over_the_span_in_cluster_gpus() -> None:
    jobs = [job(0, 4, 10.0, 0.0), job(1, 8, 5.0, 1.0), job(2, 2, 1.0, 2.0)]
    assert demand_gpu_s(jobs, TRUTH, CLUSTER, REF) == pytest.approx(82 * 3600, rel=1e-4)
    load = 82 / 2.0 / CLUSTER.total_gpus  # 82 GPU-hours over 2 h
    assert offered_load(jobs, TRUTH, CLUSTER, REF) == pytest.approx(load, rel=1e-4)
    factor = compression(jobs, TRUTH, CLUSTER, REF)
    assert factor == pytest.approx(TARGET / load, rel=1e-4)
    squeezed = trim(jobs, compress=factor)
    assert offered_load(squeezed, TRUTH, CLUSTER, REF) == pytest.approx(TARGET, rel=1e-4)


def test_a_trace_already_above_the_target_is_not_spread_out() -> None:
    heavy = [job(i, 16, 50.0, 0.1 * i) for i in range(20)]
    assert offered_load(heavy, TRUTH, CLUSTER, REF) > TARGET
    assert compression(heavy, TRUTH, CLUSTER, REF) == 1.0


def test_the_traces_experiment_runs_every_trace_at_the_target_load() -> None:
    exp = define("traces", policies=("hops", "gavel"), first_n=200)
    assert [label for label, _ in exp.runs][:2] == ["cluster01/hops", "cluster01/gavel"]
    assert {s.workload for _, s in exp.runs} == {f"elasticflow-cluster0{i}" for i in range(1, 5)}
    for _, spec in exp.runs:
        assert spec.first_n == 200 and spec.compress >= 1.0
    with pytest.raises(ValueError, match="does not apply to 'traces'"):
        define("traces", generator="literal")


def test_a_lower_load_compresses_less_and_offers_that_load() -> None:
    jobs = [job(i, 2, 1.0, 4.0 * i) for i in range(10)]  # light: well under 1.35
    factors = [compression(jobs, TRUTH, CLUSTER, REF, target) for target in (0.8, 1.0, TARGET)]
    assert 1.0 < factors[0] < factors[1] < factors[2]
    for target, factor in zip((0.8, 1.0, TARGET), factors, strict=True):
        squeezed = trim(jobs, compress=factor)
        assert offered_load(squeezed, TRUTH, CLUSTER, REF) == pytest.approx(target, rel=1e-4)


def test_the_traces_experiment_takes_its_load() -> None:
    default = define("traces", policies=("hops",), first_n=200, trace="elasticflow-cluster01")
    lighter = define("traces", policies=("hops",), first_n=200, trace="elasticflow-cluster01",
                     load=1.0)
    assert "1.35x" in default.title and "1x" in lighter.title
    (_, heavy), = default.runs
    (_, light), = lighter.runs
    assert 1.0 <= light.compress < heavy.compress
    with pytest.raises(ValueError, match="load must be above 0"):
        define("traces", policies=("hops",), first_n=200, load=0.0)
    with pytest.raises(ValueError, match="a load does not apply to 'table3'"):
        define("table3", load=1.0)


def test_the_command_runs_the_traces_at_the_load_given(tmp_path: Path) -> None:
    args = ["experiment", "traces", "--trace", "elasticflow-cluster01", "--first-n", "20",
            "--policy", "hops", "--no-progress", "--load", "1.1", "--out", str(tmp_path)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "compressed to 1.1x the cluster's GPUs" in done.output
    ran = json.loads((tmp_path / "cluster01_hops" / "summary.json").read_text())["run"]
    (_, spec), = define("traces", policies=("hops",), first_n=20,
                        trace="elasticflow-cluster01", load=1.1).runs
    assert ran["compress"] == spec.compress
    (_, default), = define("traces", policies=("hops",), first_n=20,
                           trace="elasticflow-cluster01").runs
    assert spec.compress < default.compress
