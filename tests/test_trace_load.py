"""The rule that sets the ElasticFlow traces' load (experiments/traces/load.py):
offered load is the GPU-seconds asked over the arrival span in units of the
cluster's GPUs, and the compression brings it to 1.35x, never spreading a
trace out."""

from __future__ import annotations

import pytest

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
