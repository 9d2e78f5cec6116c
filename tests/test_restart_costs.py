"""Per-model checkpoint-restart costs (world.restarts, from Sia's measured
penalties): the simulator pauses each start by the job's own cost, and the
policies see it (``JobState.restart_s``) in Sia's restart factor (Eq. 2)
and Hops' reconfiguration cost (the cost over the round length)."""

from __future__ import annotations

import msgspec
import pytest

from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.policies.sia.policy import SiaSettings
from scheduling.registry import make_policy
from scheduling.rounds import RESTART_S, ROUND_S, restart_cost
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.snapshot import JobState, Snapshot
from simulator.engine import Simulation
from simulator.settings import SimSettings
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.restarts import OTHER_S
from world.restarts import restart_cost as model_cost
from world.truth import GroundTruth

RTX = GpuType("RTX3090")


@pytest.mark.parametrize(("model", "seconds"), [
    ("resnet50-imagenet", 250.0), ("gavel:ResNet-50 (batch size 64)", 250.0),
    ("distilbert-imdb", 120.0), ("macbert-c3", 120.0), ("gpt2-medium-wikitext", 120.0),
    ("gavel:Transformer (batch size 32)", 120.0), ("resnet18-cifar10", 30.0),
    ("wav2vec2-common-language", 25.0), ("gavel:A3C", OTHER_S), ("vit-food101", OTHER_S),
])
def test_each_model_costs_what_sia_measured_for_its_workload(model: str, seconds: float) -> None:
    assert model_cost(model) == seconds


def test_every_catalog_model_has_a_cost_between_the_measured_extremes() -> None:
    assert all(25.0 <= model_cost(m) <= 250.0 for m in builtin_catalog())


def finish(model: str, restart_s: float | None) -> tuple[float, int]:
    cluster = Cluster(gpu_types=(GpuTypeSpec(RTX, 2.5e9, 1e9),),
                      servers=(Server(ServerId("n0"), RTX, 4),))
    truth = GroundTruth(cluster, builtin_catalog())
    m = builtin_catalog()[model]
    spec = JobSpec(JobId("a"), model, m.batch_size, m.params, 2_000_000, requirements=(1,))
    sim = Simulation(cluster, [SimJob(spec, model)], make_policy("hops"), truth,
                     SimSettings(restart_s=restart_s))
    (job,) = sim.run().jobs
    assert job.finish is not None
    return job.finish, job.restarts


def test_the_simulator_pauses_each_start_by_the_models_own_cost() -> None:
    own, starts = finish("resnet50-imagenet", None)
    uniform, same = finish("resnet50-imagenet", 30.0)
    assert starts == same >= 1
    assert own - uniform == pytest.approx(starts * (250.0 - 30.0))
    cifar, _ = finish("resnet18-cifar10", None)
    assert cifar == pytest.approx(finish("resnet18-cifar10", 30.0)[0])


def state(restart_s: float) -> JobState:
    spec = JobSpec(JobId("a"), "m", 32, 1000, 10**6, requirements=(1,))
    return JobState(spec=spec, restart_s=restart_s)


def test_an_unknown_cost_is_the_default_and_a_known_one_is_the_jobs() -> None:
    assert restart_cost(state(0.0)) == RESTART_S
    assert restart_cost(state(250.0)) == 250.0


def test_hops_charges_each_job_its_restart_over_the_horizon() -> None:
    cluster = Cluster(gpu_types=(GpuTypeSpec(RTX, 2.5e9, 1e9),),
                      servers=(Server(ServerId("n0"), RTX, 4),))
    est = JobEstimate(JobId("a"), {RTX: ThroughputCurve(agg=(100.0,))})
    snap = Snapshot(now=0.0, cluster=cluster, jobs=(), estimates={JobId("a"): est})
    # 10**6 samples at the best 100/s: 10,000 s to go.
    myopic = HopsPolicy(HopsSettings(reconfig_horizon="round"))
    assert myopic._reconfig_cost(snap, state(250.0)) == pytest.approx(250.0 / ROUND_S)
    assert myopic._reconfig_cost(snap, state(0.0)) == pytest.approx(RESTART_S / ROUND_S)
    assert myopic._reconfig_cost(snap, state(600.0)) == 1.0
    remaining = HopsPolicy()
    assert remaining._reconfig_cost(snap, state(250.0)) == pytest.approx(250.0 / 10_000)
    short = msgspec.structs.replace(state(250.0), done_samples=10**6 - 1000)
    assert remaining._reconfig_cost(snap, short) == pytest.approx(250.0 / ROUND_S)
    assert HopsPolicy(HopsSettings(reconfig_cost=0.0))._reconfig_cost(snap, state(250.0)) == 0.0
    with pytest.raises(ValueError):
        HopsSettings(reconfig_horizon="forever")


def test_sia_takes_each_jobs_penalty_unless_the_operator_sets_one() -> None:
    # The plan-level effect is tests/test_sia.py's
    # test_restart_factor_takes_each_jobs_own_restart_cost.
    assert SiaSettings().restart_penalty is None
    with pytest.raises(ValueError):
        SiaSettings(restart_penalty=-1.0)
