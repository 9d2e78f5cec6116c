"""``hops policies``: what the registry knows, and for one spec its settings
and the traits the live system asks of it, answered by its layers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from scheduling.registry import CORE_POLICIES, POLICIES, TASK_POLICIES, TENANT_POLICIES

runner = CliRunner()


def _json(*args: str) -> dict[str, object]:
    result = runner.invoke(app, ["policies", *args, "--json"])
    assert result.exit_code == 0, result.output
    out: dict[str, object] = json.loads(result.output)
    return out


def test_the_list_names_every_registered_policy_by_kind() -> None:
    assert _json() == {"cluster": list(POLICIES), "tenant": list(TENANT_POLICIES),
                       "cores": list(CORE_POLICIES), "task": list(TASK_POLICIES)}


@pytest.mark.parametrize(("spec", "cells", "cores", "beyond", "quota"), [
    ("hops", False, False, True, False),
    ("sia:lam=1.2", False, False, True, False),
    ("hived:opportunistic=false,inner=hops:lam=inf", True, False, False, False),
    ("hived", True, False, True, False),
    ("quota", True, False, False, True),
    ("quota-borrow", True, False, True, True),
    ("coda", False, True, True, False),
    ("drf:inner=gavel", False, True, True, False),
])
def test_a_spec_shows_the_traits_its_layers_answer(
    spec: str, cells: bool, cores: bool, beyond: bool, quota: bool
) -> None:
    info = _json(spec)
    assert info["kind"] == "round-based"
    assert (info["needs_cells"], info["schedules_cores"]) == (cells, cores)
    assert (info["beyond_reservation"], info["quota_per_gpu_type"]) == (beyond, quota)


def test_a_spec_shows_every_setting_with_its_value() -> None:
    settings = _json("sia:lam=1.2")["settings"]
    assert isinstance(settings, dict)
    assert settings["name"] == "sia" and settings["lam"] == 1.2


def test_a_task_policy_is_named_for_the_experiment_it_runs_under() -> None:
    info = _json("hare:ties=order")
    assert info["kind"].startswith("task-level")  # type: ignore[union-attr]
    assert info["settings"] == {"name": "hare", "placement": "earliest-free", "ties": "order"}
    assert "needs_cells" not in info


@pytest.mark.parametrize(("spec", "said"), [
    ("nope", "unknown policy 'nope'"),
    ("sia:sigma=2", "policy sia takes no setting sigma"),
    ("gavel:lam=", "gavel"),
])
def test_a_bad_spec_is_one_line_and_exit_2(spec: str, said: str) -> None:
    result = runner.invoke(app, ["policies", spec])
    assert result.exit_code == 2
    assert said in result.output and result.output.startswith("error: ")
