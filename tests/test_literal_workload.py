"""§4.2's requirement sets read literally (``paper-*-literal``), the JCT
floor of a workload and the experiments' ``--generator``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from experiments.common.floor import floor
from experiments.common.simrun import RunSpec, simulate
from experiments.tables.define import define, with_variants
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from simulator.generators import requirement_set_literal
from simulator.metrics import summarize
from simulator.workloads import (
    GENERATORS,
    SimJob,
    load_workload,
    paper_physical,
    paper_physical_literal,
    paper_sim,
    paper_sim_literal,
    requirement_set,
)
from tests.test_workloads import CATALOG, PHYSICAL, SIM, SIM_TRUTH, TRUTH
from world.truth import GroundTruth

RTX = GpuType("RTX3090")
MODEL = "resnet50-imagenet"


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_literal_sets_have_one_to_eight_distinct_counts_within_1_16(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(20):
        reqs = requirement_set_literal(rng)
        assert 1 <= len(reqs) <= 8
        assert list(reqs) == sorted(set(reqs))
        assert all(1 <= g <= 16 for g in reqs)


@pytest.mark.parametrize("seed", [0, 3])
def test_literal_generators_keep_arrivals_models_and_lengths(seed: int) -> None:
    pairs = [
        (paper_physical(seed, CATALOG, TRUTH, PHYSICAL),
         paper_physical_literal(seed, CATALOG, TRUTH, PHYSICAL)),
        (paper_sim(seed, CATALOG, SIM_TRUTH, SIM),
         paper_sim_literal(seed, CATALOG, SIM_TRUTH, SIM)),
        (load_workload("paper-sim", SIM_TRUTH, SIM, seed=seed, first_n=50),
         load_workload("paper-sim-literal", SIM_TRUTH, SIM, seed=seed, first_n=50)),
    ]
    for project, literal in pairs:
        assert len(project) == len(literal)
        for a, b in zip(project, literal, strict=True):
            assert (a.spec.id, a.model, a.spec.submit_time, a.spec.total_samples) == (
                b.spec.id, b.model, b.spec.submit_time, b.spec.total_samples)
        # The sets themselves do change.
        assert [j.spec.requirements for j in project] != [j.spec.requirements for j in literal]
    assert {"paper-sim-literal", "paper-physical-literal"} <= set(GENERATORS)


def test_literal_sets_do_not_depend_on_length_unlike_the_projects() -> None:
    rng = np.random.default_rng(7)
    n = 4000

    def mean_max(draw: list[tuple[int, ...]]) -> float:
        return sum(max(r) for r in draw) / len(draw)

    literal_s = mean_max([requirement_set_literal(rng) for _ in range(n)])
    literal_xl = mean_max([requirement_set_literal(rng) for _ in range(n)])
    project_s = mean_max([requirement_set("S", rng) for _ in range(n)])
    project_xl = mean_max([requirement_set("XL", rng) for _ in range(n)])
    assert abs(literal_s - literal_xl) < 0.5
    assert project_xl - project_s > 5.0
    # And in a generated workload: jobs of S and XL models get alike sets.
    jobs = paper_sim_literal(1, CATALOG, SIM_TRUTH, SIM, n=2000)
    by_cat: dict[str, list[tuple[int, ...]]] = {"S": [], "XL": []}
    for j in jobs:
        cat = CATALOG[j.model].category
        if cat in by_cat:
            by_cat[cat].append(j.spec.requirements)
    assert abs(mean_max(by_cat["S"]) - mean_max(by_cat["XL"])) < 1.5


def tiny_cluster() -> Cluster:
    """One RTX3090 type on a slower host (Sugon) and a faster one (TIGERWAY
    10G), four GPUs each."""
    return Cluster(
        gpu_types=(GpuTypeSpec(RTX, link_bandwidth=2.5e9, net_bandwidth=1e9),),
        servers=(
            Server(ServerId("slow"), RTX, 4, model="Sugon W780-G", cpu="2x Xeon Gold 5118"),
            Server(ServerId("fast"), RTX, 4, model="TIGERWAY YK8100-10G",
                   cpu="2x Xeon Gold 5320"),
        ),
    )


def job(jid: str, reqs: tuple[int, ...], samples: int, submit: float = 0.0) -> SimJob:
    m = CATALOG[MODEL]
    spec = JobSpec(id=JobId(jid), model=MODEL, batch_size=m.batch_size, params=m.params,
                   total_samples=samples, requirements=reqs, submit_time=submit)
    return SimJob(spec, MODEL)


def test_floor_is_the_samples_over_the_best_true_throughput() -> None:
    cluster = tiny_cluster()
    truth = GroundTruth(cluster, CATALOG)
    slow = truth.throughput(MODEL, Configuration.of({"slow": 1}))
    fast = truth.throughput(MODEL, Configuration.of({"fast": 1}))
    assert fast > slow  # the floor must pick the faster host
    eight = truth.throughput(MODEL, Configuration.of({"slow": 4, "fast": 4}))
    jobs = [job("one", (1,), 1_000_000), job("eight", (8,), 2_000_000, submit=100.0),
            job("too-big", (16,), 1_000)]
    got = floor(jobs, truth, cluster)
    assert got[JobId("one")] == pytest.approx(1_000_000 / fast, rel=1e-12)
    assert got[JobId("eight")] == pytest.approx(2_000_000 / eight, rel=1e-12)
    assert JobId("too-big") not in got  # no type has 16 GPUs


def test_summary_reports_the_floor_and_the_excess() -> None:
    cluster, result = simulate(RunSpec(cluster="paper-physical",
                                       workload="paper-physical-literal", first_n=3))
    s = summarize(result, cluster)
    assert s["jobs_finished"] == 3
    assert set(result.floor_s) == {j.id for j in result.jobs}
    floors = [result.floor_s[j.id] for j in result.jobs]
    assert s["floor_avg_jct_h"] == pytest.approx(sum(floors) / 3 / 3600)
    assert s["excess_avg_jct_h"] == pytest.approx(s["avg_jct_h"] - s["floor_avg_jct_h"])
    first = min(j.submit for j in result.jobs)
    assert s["floor_makespan_h"] == pytest.approx(
        max(j.submit + result.floor_s[j.id] for j in result.jobs) / 3600 - first / 3600)
    for j in result.jobs:  # no schedule beats the floor
        assert j.jct_s is not None and j.jct_s >= result.floor_s[j.id]
    # Without floors the keys are there, at 0.
    bare = summarize(result, cluster, floor={})
    assert (bare["floor_avg_jct_h"], bare["excess_avg_jct_h"]) == (0.0, 0.0)


def test_define_switches_the_workload_by_generator() -> None:
    for name, project, literal in (("table3", "paper-physical", "paper-physical-literal"),
                                   ("table4", "paper-sim", "paper-sim-literal"),
                                   ("priorities", "paper-sim", "paper-sim-literal"),
                                   ("arrival-rates", "paper-sim", "paper-sim-literal")):
        assert {s.workload for _, s in define(name).runs} == {project}
        assert {s.workload for _, s in define(name, generator="literal").runs} == {literal}
    with pytest.raises(ValueError, match="does not apply to 'elasticflow'"):
        define("elasticflow", generator="literal")
    with pytest.raises(ValueError, match="unknown generator"):
        define("table4", generator="paper")


def test_the_cli_refuses_a_bad_generator(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, error in (
        (["table4", "--generator", "paper"], "--generator must be one of project, literal"),
        (["elasticflow", "--generator", "literal"], "does not apply to 'elasticflow'"),
        (["sharing", "--generator", "literal"], "does not apply to 'sharing'"),
    ):
        done = runner.invoke(app, ["experiment", *args, "--out", str(tmp_path)])
        assert done.exit_code == 2 and error in done.output, (args, done.output)


def test_variants_run_beside_the_policy_they_vary(tmp_path: Path) -> None:
    assert with_variants(("hops", "sia", "gavel"), ("sia-estimator", "hops-paper")) == (
        "hops", "hops-paper", "sia", "sia-estimator", "gavel")
    assert with_variants(("gavel",), ("hops-paper",)) == ("gavel", "hops-paper")
    with pytest.raises(ValueError, match="unknown variant 'sia'"):
        with_variants(("hops",), ("sia",))
    done = CliRunner().invoke(app, ["experiment", "table4", "--variant", "hops-fast",
                                    "--out", str(tmp_path)])
    assert done.exit_code == 2 and "unknown variant 'hops-fast'" in done.output
