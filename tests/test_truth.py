"""The simulator's catalog and ground truth: Gavel's measurements reproduced,
entity differences, placement sensitivity, pacing, and noisy observations the
estimator learns from."""

from __future__ import annotations

import ast
import json
from importlib import resources

import numpy as np
import pytest

from estimation.database import ThroughputDatabase
from estimation.estimator import predict
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from world.catalog import GAVEL_PREFIX, ModelTruth, builtin_catalog, gavel_catalog
from world.clusters import builtin_cluster
from world.truth import PROFILE_STARTUP_S, GroundTruth

CATALOG = builtin_catalog()
PHYSICAL = builtin_cluster("paper-physical")
TRUTH = GroundTruth(PHYSICAL, CATALOG)


def cfg(**parts: int) -> Configuration:
    return Configuration.of({k.replace("_", "-"): v for k, v in parts.items()})


def gavel_8gpu_cluster() -> Cluster:
    """Gavel's types on 8-GPU servers, so that every measured point has a placement."""
    types = tuple(GpuTypeSpec(GpuType(t), 1e9, 2.5e8) for t in ("K80", "P100", "V100"))
    servers = tuple(
        Server(ServerId(f"{t.name.lower()}-{i}"), t.name, 8) for t in types for i in range(8)
    )
    return Cluster(gpu_types=types, servers=servers)


def raw_gavel() -> dict[str, dict[tuple[str, int], float]]:
    text = (resources.files("world") / "data" / "gavel" / "simulation_throughputs.json")
    raw = json.loads(text.read_text())
    return {
        worker: {ast.literal_eval(k): v["null"] for k, v in table.items()}
        for worker, table in raw.items()
    }


def test_catalog_names_are_unique_and_cover_both_sources() -> None:
    paper = [m for m in CATALOG.values() if m.source == "paper"]
    gavel = [m for m in CATALOG.values() if m.source == "gavel"]
    assert len(paper) == 21 and len(gavel) == 26
    assert all(name == m.name for name, m in CATALOG.items())
    assert "resnet18-imagenet" in CATALOG
    assert "gavel:ResNet-50 (batch size 64)" in CATALOG
    assert CATALOG["resnet18-imagenet"].by_type[GpuType("RTX3090")].data.bimodal


def test_truth_reproduces_gavel_measurements_at_measured_points() -> None:
    cluster = gavel_8gpu_cluster()
    truth = GroundTruth(cluster, gavel_catalog())
    checked = 0
    for worker, table in raw_gavel().items():
        gpu = worker.split("_")[0].upper()
        spread = worker.endswith("_unconsolidated")
        for (job_type, k), steps_per_s in table.items():
            if steps_per_s <= 0 or (spread and k == 1):
                continue
            model = truth.catalog[GAVEL_PREFIX + job_type]
            prefix = gpu.lower()
            parts = {f"{prefix}-{i}": 1 for i in range(k)} if spread else {f"{prefix}-0": k}
            got = truth.throughput(model.name, Configuration.of(parts))
            assert got == pytest.approx(steps_per_s * model.batch_size, rel=1e-9)
            checked += 1
    assert checked > 400


def test_gavel_split_gives_back_the_single_gpu_time_and_interpolates() -> None:
    truth = GroundTruth(gavel_8gpu_cluster(), gavel_catalog())
    name = "gavel:ResNet-50 (batch size 64)"
    tt = truth.catalog[name].by_type[GpuType("V100")]
    t1 = truth.iteration_time(name, cfg(v100_0=1))
    assert tt.t_f + tt.t_b + tt.t_u + tt.data.wait_cache == pytest.approx(t1)
    two, three, four = (truth.iteration_time(name, cfg(v100_0=n)) for n in (2, 3, 4))
    assert min(two, four) <= three <= max(two, four)
    # Beyond 8 GPUs the unconsolidated 8-GPU efficiency carries on.
    big = {f"v100-{i}": 2 for i in range(8)}
    eight = {f"v100-{i}": 1 for i in range(8)}
    assert truth.iteration_time(name, Configuration.of(big)) == pytest.approx(
        truth.iteration_time(name, Configuration.of(eight))
    )


def test_rtx3090_old_is_slower_than_its_twin() -> None:
    paper = [m for m in CATALOG.values() if m.source == "paper"]
    for m in paper:
        old = TRUTH.throughput(m.name, cfg(rtx3090_sugon_0=1))
        new = TRUTH.throughput(m.name, cfg(rtx3090_tiger_0=1))
        assert old < 0.91 * new, m.name
    # Twins of one server model and CPU are equal.
    a = TRUTH.throughput("vit-food101", cfg(titanxp_0=2))
    assert a == TRUTH.throughput("vit-food101", cfg(titanxp_3=2))


def test_entity_factors_slow_one_server() -> None:
    slow = GroundTruth(PHYSICAL, CATALOG, {ServerId("titanxp-1"): 1.3})
    base = slow.throughput("gpt2-medium-wikitext", cfg(titanxp_0=1))
    assert slow.throughput("gpt2-medium-wikitext", cfg(titanxp_1=1)) < base / 1.2
    with pytest.raises(ValueError, match="unknown server"):
        GroundTruth(PHYSICAL, CATALOG, {ServerId("nope"): 1.1})


def test_distributed_is_slower_per_gpu_for_a_comm_heavy_model() -> None:
    model = "vgg11-imagenet"  # 133M parameters
    agg = TRUTH.per_gpu_throughput(model, cfg(titanxp_0=8), ServerId("titanxp-0"))
    dist = TRUTH.per_gpu_throughput(model, cfg(titanxp_0=4, titanxp_1=4), ServerId("titanxp-0"))
    assert dist < 0.9 * agg
    one = TRUTH.throughput(model, cfg(rtx3090_tiger_0=1))
    pair = TRUTH.per_gpu_throughput(model, cfg(rtx3090_tiger_0=1, rtx3090_tiger_1=1),
                                    ServerId("rtx3090-tiger-0"))
    assert one / pair > 1.4  # above the paper's sensitivity threshold


def test_slowest_server_sets_the_pace() -> None:
    model = "resnet50-imagenet"
    mixed = cfg(titanxp_0=1, rtx3090_tiger_0=1)
    slow_pair = cfg(titanxp_0=1, titanxp_1=1)
    fast_pair = cfg(rtx3090_tiger_0=1, rtx3090_tiger_1=1)
    assert TRUTH.throughput(model, mixed) == pytest.approx(TRUTH.throughput(model, slow_pair))
    assert TRUTH.throughput(model, mixed) < 0.8 * TRUTH.throughput(model, fast_pair)
    per = {s: TRUTH.per_gpu_throughput(model, mixed, s) for s in mixed.servers}
    assert len(set(per.values())) == 1
    tput = TRUTH.throughput(model, mixed)
    assert tput == pytest.approx(CATALOG[model].batch_size * 2 / TRUTH.iteration_time(model, mixed))
    with pytest.raises(ValueError, match="not part of"):
        TRUTH.per_gpu_throughput(model, mixed, ServerId("titanxp-2"))


def test_lookups_and_validation() -> None:
    assert TRUTH.supports("resnet50-imagenet", GpuType("TitanXP"))
    assert not TRUTH.supports("resnet50-imagenet", GpuType("V100"))
    assert not TRUTH.supports("nope", GpuType("TitanXP"))
    with pytest.raises(ValueError, match="unknown model"):
        TRUTH.throughput("nope", cfg(titanxp_0=1))
    with pytest.raises(ValueError, match="unknown server"):
        TRUTH.throughput("resnet50-imagenet", cfg(ghost=1))
    typical = TRUTH.single_gpu_throughput("resnet50-imagenet", GpuType("TitanXP"))
    assert typical == pytest.approx(TRUTH.throughput("resnet50-imagenet", cfg(titanxp_0=1)))


def test_profiles_of_a_bimodal_source_vary_with_the_seed() -> None:
    job, model, server = JobId("j"), "resnet18-imagenet", ServerId("rtx3090-tiger-0")
    a, secs_a = TRUTH.profile(job, model, server, 40, np.random.default_rng(1))
    b, _ = TRUTH.profile(job, model, server, 40, np.random.default_rng(2))
    again, secs_again = TRUTH.profile(job, model, server, 40, np.random.default_rng(1))
    assert a == again and secs_a == secs_again
    assert a.modules.t_d != b.modules.t_d
    assert len(a.modules.t_d) == len(a.modules.t_w) == 40
    assert a.gpu_type == "RTX3090" and a.batch_size == CATALOG[model].batch_size
    ds = CATALOG[model].by_type[GpuType("RTX3090")].data
    cut = 0.85 * (ds.mu_cache + ds.mu_load) / 2  # 0.85: this host's data factor
    slow = sum(t > cut for t in a.modules.t_d)
    assert 3 <= slow <= 30  # both modes show up
    assert PROFILE_STARTUP_S + 40 * 0.1 < secs_a < PROFILE_STARTUP_S + 40 * 1.0
    stable, _ = TRUTH.profile(job, "distilbert-imdb", server, 10, np.random.default_rng(3))
    assert stable.modules.pattern == 2


def test_running_samples_are_unbiased_and_carry_observations() -> None:
    model, config = "resnet18-imagenet", cfg(titanxp_0=2, titanxp_1=2)
    rng = np.random.default_rng(7)
    samples = TRUTH.running_samples(JobId("j"), model, config, 30, rng)
    assert [s.server_id for s in samples] == list(config.servers)
    assert all(s.nodes == 2 and s.total_gpus == 4 and s.local_gpus == 2 for s in samples)
    assert all(len(s.data_times) == len(s.wait_times) == 30 for s in samples)
    truth = TRUTH.per_gpu_throughput(model, config, ServerId("titanxp-0"))
    draws = [TRUTH.running_samples(JobId("j"), model, config, 30, rng)[0].per_gpu_throughput
             for _ in range(300)]
    assert float(np.mean(draws)) == pytest.approx(truth, rel=0.01)
    assert float(np.std(draws)) > 0.005 * truth


def _job(model: ModelTruth) -> JobSpec:
    return JobSpec(id=JobId("j"), model=model.name, batch_size=model.batch_size,
                   params=model.params, total_samples=10**9, requirements=(1,))


def test_estimator_starts_wrong_on_a_bimodal_job_and_learns() -> None:
    m = CATALOG["resnet18-imagenet"]
    server, config = ServerId("rtx3090-tiger-0"), cfg(rtx3090_tiger_0=1)
    truth = TRUTH.throughput(m.name, config)
    initial, learned = [], []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        db = ThroughputDatabase()
        db.record_profile(TRUTH.profile(JobId("j"), m.name, server, 10, rng)[0])
        initial.append(abs(predict(db, _job(m), PHYSICAL, config) / truth - 1.0))
        for _ in range(20):
            for sample in TRUTH.running_samples(JobId("j"), m.name, config, 50, rng):
                db.record_sample(sample)
        learned.append(abs(predict(db, _job(m), PHYSICAL, config) / truth - 1.0))
    assert max(learned) < 0.03
    assert float(np.mean(initial)) > 2 * float(np.mean(learned))
