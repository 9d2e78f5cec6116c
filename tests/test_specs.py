"""Job and cluster specs: requirement sets, learning rates, file loading, errors."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.specs import SpecError, load_cluster, load_jobs

CLUSTER_YAML = """
name: two-types
gpu_types:
  - {name: TitanXP, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: RTX3090, link_bandwidth: 5.0e9, net_bandwidth: 1.0e9}
servers:
  - {id_prefix: txp-, count: 3, gpu_type: TitanXP, gpus: 8, model: Sugon W780-G}
  - {id: r0, gpu_type: RTX3090, gpus: 4, cpu: Xeon Gold 5218}
"""


def job(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        id="j", model="resnet18", batch_size=32, params=11_000_000, total_samples=1000
    )
    base.update(kw)
    return msgspec.convert(base, JobSpec)


def test_explicit_requirement_set_is_sorted_and_unique() -> None:
    assert job(requirements=[8, 2, 4, 2]).requirement_set() == (2, 4, 8)


def test_bounds_become_r_num_equal_steps() -> None:
    # [1, 15] with R_num = 8: 1 + 2i for i in 0..7
    assert job(min_gpus=1, max_gpus=15).requirement_set(8) == (1, 3, 5, 7, 9, 11, 13, 15)
    assert job(min_gpus=4, max_gpus=4).requirement_set(8) == (4,)
    # Fewer distinct integers than R_num: duplicates collapse.
    assert job(min_gpus=1, max_gpus=3).requirement_set(8) == (1, 2, 3)


def test_learning_rate_table_and_scaling_rules() -> None:
    assert job(requirements=[1, 4], lr={4: 0.3}).learning_rate(4) == 0.3
    linear = job(requirements=[1, 4], base_lr=0.1, base_gpus=1)
    assert linear.learning_rate(4) == pytest.approx(0.4)
    sqrt = job(requirements=[1, 4], base_lr=0.1, base_gpus=1, lr_rule="sqrt")
    assert sqrt.learning_rate(4) == pytest.approx(0.2)
    assert job(requirements=[1]).learning_rate(2) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"batch_size": 0, "requirements": [1]}, "batch_size"),
        ({"requirements": [0, 2]}, "requirements"),
        ({}, "requirements"),
        ({"min_gpus": 4, "max_gpus": 2}, "min_gpus"),
        ({"requirements": [1], "min_gpus": 1, "max_gpus": 2}, "not both"),
        ({"requirements": [1], "lr_rule": "cubic"}, "lr_rule"),
    ],
)
def test_invalid_job_specs_name_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message):
        job(**fields)


def test_cluster_yaml_expands_groups(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML)
    cluster = load_cluster(path)
    assert [s.id for s in cluster.servers] == ["txp-0", "txp-1", "txp-2", "r0"]
    assert cluster.total_gpus == 28
    assert cluster.type_share()["RTX3090"] == pytest.approx(4 / 28)


def test_cluster_errors_name_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CLUSTER_YAML.replace("gpus: 4", "gpus: four"))
    with pytest.raises(SpecError, match=r"bad.yaml: .*\$\.servers\[1\]\.gpus"):
        load_cluster(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(CLUSTER_YAML.replace("gpu_type: RTX3090", "gpu_type: A100"))
    with pytest.raises(SpecError, match="unknown gpu_type 'A100'"):
        load_cluster(unknown)
    with pytest.raises(SpecError, match="unknown spec format"):
        load_cluster(tmp_path / "c.ini")


def test_cluster_communication_model_fields(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER_YAML.replace(
        "net_bandwidth: 1.0e9}\n  - {name: RTX3090",
        "net_bandwidth: 1.0e9, overlap_residual: 1.0, link_latency_s: 2.0e-3,"
        " net_latency_s: 3.0e-3}\n  - {name: RTX3090"))
    titan, rtx = load_cluster(path).gpu_types
    assert (titan.overlap_residual, titan.link_latency_s, titan.net_latency_s) == (
        1.0, 0.002, 0.003)
    assert (rtx.overlap_residual, rtx.link_latency_s, rtx.net_latency_s) == (0.2, 0.0, 0.0)
    for field, value, message in (("overlap_residual", "1.5", r"must lie in \[0, 1\]"),
                                  ("net_latency_s", "-1e-3", "must be finite and >= 0")):
        path.write_text(CLUSTER_YAML.replace("link_bandwidth: 5.0e9",
                                             f"{field}: {value}, link_bandwidth: 5.0e9"))
        with pytest.raises(SpecError, match=rf"c.yaml: gpu type RTX3090: {field} {message}"):
            load_cluster(path)


def test_jobs_from_json_and_toml(tmp_path: Path) -> None:
    doc = {
        "jobs": [
            {"id": "a", "model": "vgg11", "batch_size": 32, "params": 132_000_000,
             "total_samples": 10_000, "requirements": [1, 2], "lr": {"2": 0.02}},
        ]
    }
    (tmp_path / "j.json").write_text(json.dumps(doc))
    (jobs,) = load_jobs(tmp_path / "j.json")
    assert jobs.id == JobId("a") and jobs.lr == {2: 0.02}
    (tmp_path / "j.toml").write_text(
        '[[jobs]]\nid = "b"\nmodel = "bert"\nbatch_size = 8\nparams = 110000000\n'
        "total_samples = 800\nmin_gpus = 1\nmax_gpus = 8\n"
    )
    (tjob,) = load_jobs(tmp_path / "j.toml")
    assert tjob.requirement_set(4) == (1, 3, 6, 8)


def test_configuration_is_canonical() -> None:
    a = Configuration.of({ServerId("n2"): 4, ServerId("n0"): 2})
    b = Configuration.of({"n0": 2, "n2": 4})
    assert a == b and hash(a) == hash(b)
    assert a.total_gpus == 6 and a.num_nodes == 2 and a.is_distributed
    assert str(a) == "{n0:2, n2:4}"
    with pytest.raises(ValueError, match="twice"):
        Configuration(((ServerId("n0"), 1), (ServerId("n0"), 2)))
    with pytest.raises(ValueError, match="> 0"):
        Configuration.of({"n0": 0})
