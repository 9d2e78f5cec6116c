"""Built-in clusters and the simulator's workloads: paper generators,
ElasticFlow traces, workload files and their errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shared.configuration import Configuration
from shared.ids import GpuType
from shared.specs import SpecError, load_cluster
from simulator.workloads import (
    GPU_HOURS,
    SimJob,
    dump_workload,
    load_elasticflow,
    load_workload,
    paper_physical,
    paper_sim,
)
from world.catalog import builtin_catalog
from world.clusters import BUILTIN_CLUSTERS, builtin_cluster, cluster_arg
from world.truth import GroundTruth

CATALOG = builtin_catalog()
PHYSICAL = builtin_cluster("paper-physical")
SIM = builtin_cluster("paper-sim-512")
TRUTH = GroundTruth(PHYSICAL, CATALOG)
SIM_TRUTH = GroundTruth(SIM, CATALOG)
HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_builtin_clusters_match_the_papers() -> None:
    assert (PHYSICAL.total_gpus, len(PHYSICAL.servers)) == (64, 10)
    assert load_cluster(EXAMPLES / "cluster-paper-physical.yaml") == PHYSICAL
    assert (SIM.total_gpus, len(SIM.servers)) == (512, 64)
    kinds = {(s.gpu_type, s.model, s.cpu) for s in SIM.servers}
    assert len(kinds) == 5
    gavel = builtin_cluster("gavel")
    assert {t.name: gavel.type_gpus(t.name) for t in gavel.gpu_types} == {
        "K80": 36, "P100": 36, "V100": 36,
    }
    assert set(BUILTIN_CLUSTERS) == {"paper-physical", "paper-sim-512", "gavel"}


def test_cluster_arg_takes_names_and_files(tmp_path: Path) -> None:
    assert cluster_arg("gavel") is builtin_cluster("gavel")
    assert cluster_arg(str(EXAMPLES / "cluster-paper-physical.yaml")) == PHYSICAL
    with pytest.raises(SpecError, match="neither a built-in cluster"):
        cluster_arg(str(tmp_path / "missing.yaml"))
    with pytest.raises(SpecError, match="unknown built-in cluster"):
        builtin_cluster("nope")


def signature(jobs: list[SimJob]) -> list[tuple[str, str, int, tuple[int, ...], float]]:
    return [(j.spec.id, j.model, j.spec.total_samples, j.spec.requirements, j.spec.submit_time)
            for j in jobs]


def check_requirements(jobs: list[SimJob]) -> None:
    for j in jobs:
        reqs = j.spec.requirement_set()
        assert 1 <= len(reqs) <= 8
        assert all(1 <= r <= 16 for r in reqs)


def test_paper_physical_is_deterministic_and_follows_the_paper() -> None:
    a = paper_physical(3, CATALOG, TRUTH, PHYSICAL)
    assert signature(a) == signature(paper_physical(3, CATALOG, TRUTH, PHYSICAL))
    assert signature(a) != signature(paper_physical(4, CATALOG, TRUTH, PHYSICAL))
    assert len(a) == 25
    times = [j.spec.submit_time for j in a]
    assert times == sorted(times) and times[0] >= 0 and times[-1] <= 2.5 * 3600
    check_requirements(a)
    ref = GpuType("GTX1080Ti")  # first type of the spec: job lengths count its GPU-hours
    for j in a:
        m = CATALOG[j.model]
        assert m.source == "paper" and m.category is not None
        hours = j.spec.total_samples / TRUTH.single_gpu_throughput(j.model, ref) / 3600
        lo, hi = GPU_HOURS[m.category]
        assert lo * 0.999 <= hours <= hi * 1.001
        assert j.spec.batch_size == m.batch_size and j.spec.params == m.params


def test_paper_sim_matches_counts_and_rates() -> None:
    a = paper_sim(1, CATALOG, SIM_TRUTH, SIM)
    assert signature(a) == signature(paper_sim(1, CATALOG, SIM_TRUTH, SIM))
    assert signature(a) != signature(paper_sim(2, CATALOG, SIM_TRUTH, SIM))
    assert len(a) == 500 and len({j.spec.id for j in a}) == 500
    check_requirements(a)
    for seed in range(3):
        times = [j.spec.submit_time for j in paper_sim(seed, CATALOG, SIM_TRUTH, SIM)]
        assert times[0] == 0.0
        assert float(np.mean(np.diff(times))) == pytest.approx(36.0, rel=0.12)
    fast = paper_sim(1, CATALOG, SIM_TRUTH, SIM, n=50, rate_per_h=600.0)
    assert len(fast) == 50 and fast[-1].spec.submit_time < 49 * 6.0 * 2
    models = {j.model for j in a}
    assert len(models) > 15 and all(CATALOG[m].source == "paper" for m in models)


def write_trace(tmp_path: Path, rows: list[str], name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def test_elasticflow_importer_on_a_small_trace(tmp_path: Path) -> None:
    path = write_trace(tmp_path, [
        "a,1000,10,resnet50,2000,256,4,600",
        "b,1100,10,vgg16,2000,64,1,1200",
        "c,1300,10,bert,2000,64,16,300",
        "d,1700,10,gpt2,2000,64,2,900",
    ])
    ref = GpuType("TitanXP")
    jobs = load_elasticflow(path, TRUTH, PHYSICAL, ref)
    assert [j.spec.id for j in jobs] == ["a", "b", "c", "d"]
    assert [j.model for j in jobs] == [
        "resnet50-imagenet", "vgg13-imagenet", "macbert-c3", "gpt2-medium-wikitext",
    ]
    assert [j.spec.submit_time for j in jobs] == [0.0, 100.0, 300.0, 700.0]
    assert [j.spec.requirements for j in jobs] == [(4,), (1,), (16,), (2,)]
    packed = Configuration.of({"titanxp-0": 8, "titanxp-1": 8})
    expected = 300 * TRUTH.throughput("macbert-c3", packed)
    assert jobs[2].spec.total_samples == pytest.approx(expected, abs=1)
    one = 600 * TRUTH.throughput("resnet50-imagenet", Configuration.of({"titanxp-0": 4}))
    assert jobs[0].spec.total_samples == pytest.approx(one, abs=1)

    cut = load_elasticflow(path, TRUTH, PHYSICAL, ref, first_n=2, compress=10.0, elastic=True)
    assert [j.spec.submit_time for j in cut] == [0.0, 10.0]
    assert [j.spec.requirements for j in cut] == [(2, 4, 8), (1, 2)]


def test_elasticflow_real_trace_and_dispatch(tmp_path: Path) -> None:
    jobs = load_workload("elasticflow-cluster04", TRUTH, PHYSICAL)
    assert len(jobs) == 15_802
    assert jobs[0].spec.submit_time == 0.0
    assert all(j.spec.requirements[0] <= PHYSICAL.total_gpus for j in jobs)
    first = load_workload("elasticflow-cluster04", TRUTH, PHYSICAL, first_n=100, compress=4.0)
    assert len(first) == 100
    assert first[-1].spec.submit_time == pytest.approx(jobs[99].spec.submit_time / 4.0)
    path = write_trace(tmp_path, ["x,5,1,resnet50,9,64,1,60"], name="any.csv")
    assert load_workload(str(path), TRUTH, PHYSICAL)[0].spec.id == "x"
    gavel = builtin_cluster("gavel")
    on_gavel = load_workload(str(path), GroundTruth(gavel, CATALOG), gavel)
    assert on_gavel[0].model.startswith("gavel:ResNet-50")


def test_load_workload_dispatches_generators_and_files(tmp_path: Path) -> None:
    gen = load_workload("paper-physical", TRUTH, PHYSICAL, seed=5, first_n=10, compress=2.0)
    full = paper_physical(5, CATALOG, TRUTH, PHYSICAL)
    assert [j.spec.id for j in gen] == [j.spec.id for j in full[:10]]
    assert gen[3].spec.submit_time == pytest.approx(full[3].spec.submit_time / 2.0)
    assert len(load_workload("paper-sim", SIM_TRUTH, SIM, seed=1)) == 500
    dense = load_workload("paper-sim", SIM_TRUTH, SIM, seed=1, rate_per_h=1000.0)
    assert dense[-1].spec.submit_time < 3600.0

    path = tmp_path / "work.json"
    path.write_bytes(dump_workload(full))
    assert signature(load_workload(str(path), TRUTH, PHYSICAL)) == signature(full)
    yaml_file = tmp_path / "work.yaml"
    yaml_file.write_text(
        "- spec: {id: j1, model: vit-food101, batch_size: 48, params: 85876325,\n"
        "         total_samples: 1000, requirements: [1, 2]}\n"
        "  model: vit-food101\n"
    )
    (job,) = load_workload(str(yaml_file), TRUTH, PHYSICAL)
    assert job.model == "vit-food101" and job.spec.requirements == (1, 2)


@pytest.mark.parametrize(
    ("content", "suffix", "match"),
    [
        ("job_id,when,model\n1,2,resnet50\n", ".csv", "not an ElasticFlow trace"),
        (HEADER + "a,0,1,resnet50,9,64,two,60\n", ".csv", r"trace\.csv:2: num_gpu must be"),
        (HEADER + "a,0,1,alexnet,9,64,1,60\n", ".csv", "unknown model_name 'alexnet'"),
        (HEADER + "a,0,1,resnet50,9,64,1,0\n", ".csv", "duration must be >= 1"),
        ("- {spec: {id: j, model: m, batch_size: 1, params: 1, total_samples: 1,"
         " requirements: [1]}, model: nope}\n", ".yaml", "unknown model 'nope'"),
        ("- {spec: {id: j, model: m, batch_size: 0, params: 1, total_samples: 1,"
         " requirements: [1]}, model: vit-food101}\n", ".yaml", "batch_size must be > 0"),
        ("jobs: 3\n", ".yaml", "Expected `array`"),
        ("[1, 2", ".json", "cannot read spec"),
    ],
)
def test_bad_workloads_raise_spec_errors(tmp_path: Path, content: str, suffix: str,
                                         match: str) -> None:
    path = tmp_path / f"trace{suffix}"
    path.write_text(content)
    with pytest.raises(SpecError, match=match):
        load_workload(str(path), TRUTH, PHYSICAL)


def test_bad_names_and_options_raise_spec_errors() -> None:
    with pytest.raises(SpecError, match="neither a generator"):
        load_workload("paper-nothing", TRUTH, PHYSICAL)
    with pytest.raises(SpecError, match="compress"):
        load_workload("paper-physical", TRUTH, PHYSICAL, compress=0.0)
    with pytest.raises(SpecError, match="first_n"):
        load_workload("paper-physical", TRUTH, PHYSICAL, first_n=-1)
    with pytest.raises(SpecError, match="n > 0"):
        paper_sim(0, CATALOG, SIM_TRUTH, SIM, n=0)
