"""The world model's CPU scaling (world/cpu_scaling.py) from Synergy's tables."""

from __future__ import annotations

import ast
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from bench import synergy_convert
from world.catalog import builtin_catalog, gavel_catalog, paper_catalog
from world.cpu_scaling import (
    SYNERGY_MODEL,
    CpuCurve,
    category_of,
    curve,
    curve_for,
    family,
    measured_gpus,
    synergy_model,
    synergy_models,
)

SOURCE = Path(__file__).resolve().parents[2] / "shared" / "data" / "synergy"
needs_source = pytest.mark.skipif(not (SOURCE / "models").is_dir(),
                                  reason="Synergy's source tables are not beside the repo")


def packaged() -> dict[str, Any]:
    text = (resources.files("world") / "data" / "synergy" / "cpu_scaling.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def source_table(name: str) -> list[list[float]]:
    """``self.tput`` of one of Synergy's model files, read without the converter."""
    tree = ast.parse((SOURCE / "models" / f"{name}.py").read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "self.tput"
                and isinstance(node.value, ast.Call)):
            rows: list[list[float]] = ast.literal_eval(node.value.args[0])
            return rows
    raise AssertionError(f"no self.tput in {name}")


@needs_source
@pytest.mark.parametrize("name", ["res50_1", "deepspeech_4", "alexnet_1", "m5_2", "gnmt_2"])
def test_the_json_is_the_full_memory_column_of_the_source(name: str) -> None:
    model, gpus = name.rsplit("_", 1)
    rows = source_table(name)
    axis = (1, 2, 3, 4, 5, 6, 9, 12, 24)
    expected = [(c, row[-1]) for c, row in zip(axis, rows, strict=True) if any(row)]
    table = packaged()["models"][model][gpus]
    assert list(zip(table["cores"], table["throughput"], strict=True)) == expected
    assert packaged()["commit"] == (SOURCE / "COMMIT").read_text().strip()


@needs_source
def test_the_converter_reproduces_the_packaged_files(tmp_path: Path) -> None:
    synergy_convert.main(["--source", str(SOURCE), "--out", str(tmp_path)])
    here = resources.files("world") / "data" / "synergy"
    assert (tmp_path / "cpu_scaling.json").read_text() == (here / "cpu_scaling.json").read_text()
    assert (tmp_path / "LICENSE").read_text() == (here / "LICENSE").read_text()


def test_saturation_is_synergy_s_own_best_cores_per_gpu() -> None:
    """Synergy records each table's best cores per GPU (``cpus``, read as
    ``cpu_per_gpu`` by its simulator); the curves must agree, which also
    confirms that the axis counts cores per GPU."""
    for model, by_gpus in packaged()["models"].items():
        for gpus, table in by_gpus.items():
            assert curve(model, int(gpus)).saturation() == table["synergy_cpus"], (model, gpus)


def test_interpolation_between_beyond_and_below_the_measured_points() -> None:
    c = curve("res50", 1)  # 1: 0.4, 2: 0.74, 3: 1.0, 4: 1.15, flat to 24
    assert c.speed(2) == pytest.approx(0.74)
    assert c.speed(2.5) == pytest.approx(0.87)
    assert c.speed(3.5) == pytest.approx(1.075)
    assert c.speed(48) == pytest.approx(1.15)
    assert c.speed(0) == 0.0
    assert c.speed(0.5) == pytest.approx(0.2)
    a = curve("alexnet", 1)  # 6: 1.75, 9: 2.0
    assert a.speed(7.5) == pytest.approx(1.875)
    with pytest.raises(ValueError):
        c.speed(-1)


def test_saturation_and_peak() -> None:
    assert curve("res50", 1).saturation() == 4
    assert curve("res50", 4).saturation() == 3
    assert curve("bert", 1).saturation() == 1
    assert curve("alexnet", 1).peak() == pytest.approx(2.94)


def test_the_nearest_measured_gpu_count_is_used() -> None:
    assert measured_gpus("res50") == (1, 2, 4)
    assert [curve("res50", g).gpus for g in (1, 2, 3, 4, 8)] == [1, 2, 2, 4, 4]
    assert curve("bert", 8).gpus == 1
    with pytest.raises(KeyError):
        curve("nope", 1)
    with pytest.raises(ValueError):
        curve("res50", 0)


def test_a_curve_refuses_bad_points() -> None:
    with pytest.raises(ValueError):
        CpuCurve("x", 1, (2, 1), (1.0, 1.0))
    with pytest.raises(ValueError):
        CpuCurve("x", 1, (1, 2), (1.0,))


def test_every_catalog_model_maps_to_a_measured_synergy_model() -> None:
    known = set(synergy_models())
    assert set(SYNERGY_MODEL.values()) <= known
    for name in builtin_catalog():
        assert synergy_model(name) in known, name
        assert category_of(name) in ("cv", "nlp", "speech", "other")
        assert curve_for(name, 2).model == synergy_model(name)


def test_every_mapped_family_is_in_a_catalog() -> None:
    families = {family(name) for name in (*paper_catalog(), *gavel_catalog())}
    assert families == set(SYNERGY_MODEL)


def test_families_and_categories_of_some_models() -> None:
    assert family("gavel:ResNet-50 (batch size 64)") == "ResNet-50"
    assert family("gavel:A3C") == "A3C"
    assert family("convnext-base-imagenet") == "convnext-base"
    assert synergy_model("resnet50-imagenet") == "res50"
    assert synergy_model("mobilenetv2-cifar10") == "mobilenet"
    assert category_of("wav2vec2-common-language") == "speech"
    assert category_of("gavel:LM (batch size 20)") == "nlp"
    assert category_of("gavel:Recommendation (batch size 512)") == "other"
    with pytest.raises(KeyError):
        family("resnet")
