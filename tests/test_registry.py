"""The policy registry of the core: specs by name with typed settings, one
parser for every entry point, and clear errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.policies import make_policy, resolve
from scheduling.policies.gavel.policy import GavelPolicy, GavelSettings
from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.policies.sia.policy import SiaPolicy, SiaSettings
from scheduling.policies.slurm.policy import SlurmPolicy, SlurmSettings
from scheduling.policies.themis.policy import ThemisPolicy, ThemisSettings
from scheduling.policies.tiresias.policy import TiresiasPolicy, TiresiasSettings
from scheduling.registry import (
    POLICIES,
    SPECS,
    TASK_POLICIES,
    GavelSpec,
    HopsPaperSpec,
    HopsProfilePreemptSpec,
    HopsSpec,
    PolicyError,
    SiaEstimatorSpec,
    SiaLpStartSpec,
    SiaSpec,
    SlurmSpec,
    ThemisSpec,
    TiresiasSpec,
    make_task_policy,
    parse_policy,
    policy_name,
    settings_of,
    spec_text,
    with_settings,
)
from scheduling.registry import make_policy as core_make
from services.runtime.settings import SettingsError
from services.scheduler.settings import scheduler_settings

SAMPLES: dict[type, object] = {str: "ftf", float: 0.37, int: 3, bool: True}


def test_every_policy_has_a_spec_and_its_policys_defaults() -> None:
    assert POLICIES == ("hops", "hops-profile-preempt", "hops-paper", "sia", "sia-lp-start",
                        "sia-estimator", "gavel", "slurm", "tiresias", "themis")
    assert msgspec.structs.asdict(HopsSpec()) == msgspec.structs.asdict(HopsSettings())
    assert msgspec.structs.asdict(SlurmSpec()) == msgspec.structs.asdict(SlurmSettings())
    assert msgspec.structs.asdict(TiresiasSpec()) == msgspec.structs.asdict(TiresiasSettings())
    assert msgspec.structs.asdict(ThemisSpec()) == msgspec.structs.asdict(ThemisSettings())
    assert msgspec.structs.asdict(SiaSpec()) == msgspec.structs.asdict(SiaSettings())
    assert msgspec.structs.asdict(GavelSpec()) == msgspec.structs.asdict(GavelSettings())
    assert HopsProfilePreemptSpec().profile_preempt and not HopsSpec().profile_preempt
    assert SiaLpStartSpec().start == "rounded-lp" and SiaSpec().start == "search"
    paper = HopsPaperSpec()  # the paper's Hops: no reconfiguration cost, no fill filter, 1%
    assert (paper.reconfig_cost, paper.fill_filter, paper.accept_gap) == (0.0, False, 0.01)
    assert HopsSpec().reconfig_cost is None and HopsSpec().fill_filter
    assert SiaEstimatorSpec().throughput == "estimator" and SiaSpec().throughput == "bootstrap"
    for name in POLICIES:
        assert policy_name(parse_policy(name)) == name


def test_parse_text_and_json_forms() -> None:
    assert parse_policy("hops") == HopsSpec()
    assert parse_policy(" sia:lam=1.2 ") == SiaSpec(lam=1.2)
    spec = parse_policy("hops:sigma=1.6,priority=ftf, lam=inf")
    assert spec == HopsSpec(sigma=1.6, priority="ftf", lam=math.inf)
    assert parse_policy("sia:round_decimals=null,scale_to_min_gpus=false") == SiaSpec(
        round_decimals=None, scale_to_min_gpus=False
    )
    assert parse_policy('{"name": "gavel", "lam": 0, "global_queue": true}') == GavelSpec(
        lam=0.0, global_queue=True
    )


def test_the_mechanism_gets_the_policy_with_its_settings() -> None:
    hops = core_make(parse_policy("hops:sigma=1.6"))
    assert isinstance(hops, HopsPolicy) and hops.settings.sigma == 1.6
    assert isinstance(core_make("sia-lp-start:lam=2"), SiaPolicy)
    gavel = core_make("gavel:lam=0")
    assert isinstance(gavel, GavelPolicy) and gavel.settings.lam == 0.0
    slurm = core_make("slurm:favor_small=true")
    assert isinstance(slurm, SlurmPolicy) and slurm.settings.favor_small
    tiresias = core_make("tiresias:promote_knob=2")
    assert isinstance(tiresias, TiresiasPolicy) and tiresias.settings.promote_knob == 2.0
    themis = core_make("themis:fairness_knob=0.5")
    assert isinstance(themis, ThemisPolicy) and themis.settings.fairness_knob == 0.5


@pytest.mark.parametrize("name", POLICIES)
def test_every_setting_is_settable_and_round_trips(name: str) -> None:
    for field in msgspec.structs.fields(SPECS[name]):
        if field.name == "start":
            value: object = "rounded-lp" if name == "sia" else "search"
        elif field.name == "round_decimals":
            value = 3
        elif field.name == "throughput":
            value = "estimator"
        elif field.name == "reconfig_horizon":
            value = "round"
        elif field.name in ("reconfig_cost", "restart_penalty"):  # None: each job's own
            value = 0.25
        else:
            value = SAMPLES[type(field.default)]
        spec = with_settings(parse_policy(name), {field.name: value})
        assert getattr(spec, field.name) == value
        assert parse_policy(spec_text(spec)) == spec


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("sjf", ["unknown policy 'sjf'", "hops", "gavel"]),
        ("gavel:sigma=1.2", ["policy gavel takes no setting sigma", "lam"]),
        ("sia:sigma=1.2,bogus=1", ["policy sia takes no setting bogus, sigma"]),
        ("sia:lam=-1", ["policy sia", "lam must be finite and >= 0"]),
        ("hops:lam=soon", ["policy hops", "lam"]),
        ("hops:priority=best", ["policy hops", "unknown priority 'best'"]),
        ("hops:sigma", ["'sigma' is not SETTING=VALUE"]),
        ('{"lam": 1}', ["needs a name"]),
        ("{nope", ["policy '{nope'"]),
    ],
)
def test_bad_specs_fail_with_one_clear_error(text: str, words: list[str]) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(text)
    for w in words:
        assert w in str(err.value)


def test_cli_flags_override_the_spec_and_are_refused_where_not_taken() -> None:
    assert resolve("sia:lam=2", priority=None, lam=None) == SiaSpec(lam=2.0)
    assert resolve("sia:lam=2", lam=3.0) == SiaSpec(lam=3.0)
    assert resolve("gavel", lam=0.5) == GavelSpec(lam=0.5)  # no longer dropped
    with pytest.raises(PolicyError, match="policy gavel takes no setting sigma"):
        resolve("gavel", sigma=1.6)
    policy = make_policy("hops", "ftf")
    assert isinstance(policy, HopsPolicy) and policy.settings.priority == "ftf"
    assert "sigma" in settings_of("hops") and "sigma" not in settings_of("sia")


def test_live_settings_read_the_policy_from_env_and_flags() -> None:
    assert scheduler_settings({}).policy == HopsSpec()
    assert scheduler_settings({"HOPS_POLICY": "sia:lam=1.2"}).policy == SiaSpec(lam=1.2)
    flags = {"policy": "gavel"}
    assert scheduler_settings({"HOPS_POLICY": "sia"}, flags).policy == GavelSpec()
    with pytest.raises(SettingsError, match="HOPS_POLICY: unknown policy 'nope'"):
        scheduler_settings({"HOPS_POLICY": "nope"})
    with pytest.raises(SettingsError, match="--policy: policy gavel takes no setting sigma"):
        scheduler_settings({}, {"policy": "gavel:sigma=2"})


def test_the_cli_takes_a_policy_spec_and_refuses_a_bad_one(tmp_path: Path) -> None:
    runner = CliRunner()
    for policy in ("gavel", "sia:lam=1.2", "hops:sigma=1.6"):
        done = runner.invoke(app, ["plan", "--policy", policy, "--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["reasons"]["policy"] == policy.partition(":")[0]
    done = runner.invoke(app, ["plan", "--priority", "srtf", "--lam", "2"])
    assert done.exit_code == 0, done.output
    bad = [
        (["plan", "--policy", "gavel", "--sigma", "1.2"], "policy gavel takes no setting sigma"),
        (["simulate", "--cluster", "paper-physical", "--workload", "paper-physical",
          "--out", str(tmp_path), "--policy", "nope"], "unknown policy 'nope'"),
        (["experiment", "table3", "--out", str(tmp_path), "--policy", "sia:sigma=1"],
         "policy sia takes no setting sigma"),
        (["up", "--policy", "gavel:lam=soon"], "policy gavel"),
    ]
    for args, error in bad:
        done = runner.invoke(app, args)
        assert done.exit_code == 2 and error in done.output, (args, done.output)


def test_task_policies_are_named_here_and_refused_by_the_round_based_entry_points() -> None:
    assert TASK_POLICIES == ("hare", "hare-eft", "gavel-fifo", "srtf", "homo", "allox")
    assert [make_task_policy(n).name for n in TASK_POLICIES] == list(TASK_POLICIES)
    with pytest.raises(PolicyError, match="task-level policy"):
        parse_policy("hare-eft")
    with pytest.raises(PolicyError, match="unknown task policy 'hops'"):
        make_task_policy("hops")
