"""The import contract of docs/design.md ("Layers"): the core imports no bus,
event loop, clock, environment, service shell, gateway, CLI or experiment,
and the in-job plugin (`hops`) nothing of the project but the job contract.

`make test` runs `lint-imports` on the repository. These tests show that the
contract in pyproject.toml bites: run on a temporary copy of the packages, it
passes, then fails once bad modules are added to the copy; and that no pure
module of `services/` or `gateway/` has been left out of it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import grimp

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _config() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["importlinter"]
    return config


def _contract(contract_id: str) -> dict[str, Any]:
    contracts: list[dict[str, Any]] = _config()["contracts"]
    (contract,) = (c for c in contracts if c["id"] == contract_id)
    return contract


def _sources_only(directory: str, names: list[str]) -> list[str]:
    # The checker reads only Python sources; the simulator's data files would
    # only slow the copy down.
    return [n for n in names
            if n == "__pycache__" or (not n.endswith(".py") and not Path(directory, n).is_dir())]


def _copy_packages(dest: Path) -> None:
    for package in _config()["root_packages"]:
        shutil.copytree(ROOT / package, dest / package, ignore=_sources_only)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def _lint(cwd: Path) -> tuple[int, str]:
    # lint-imports puts its working directory first on sys.path, so the copy,
    # not the editable install, is what it analyses. PYTHONPATH could reorder
    # that, so it is dropped.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    # The report wraps long lines to the terminal's width.
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def test_the_contract_fails_on_bad_imports_in_temporary_modules(tmp_path: Path) -> None:
    _copy_packages(tmp_path)
    rc, out = _lint(tmp_path)
    assert rc == 0, out

    bad = {
        # A clock and a bus, directly.
        "shared/probe_clock.py": "import time\n",
        "simulator/probe_bus.py": "import nats.aio.client\n",
        # A service shell and the gateway.
        "scheduling/policies/hops/probe_shell.py": "from services.scheduler import leader\n",
        "shared/probe_gateway.py": "from gateway import access\n",
        # The event loop, indirectly: through a helper that is not in the core.
        "services/scheduler/probe_helper.py": "import asyncio\n",
        "simulator/probe_indirect.py": "from services.scheduler import probe_helper\n",
        # The world model: no clock, and nothing above it.
        "world/probe_clock.py": "import time\n",
        "world/probe_simulator.py": "from simulator import engine\n",
        # The in-job plugin: a scheduler and a shared module outside the job contract.
        "hops/plugin/probe_scheduler.py": "from scheduling import registry\n",
        "hops/plugin/probe_specs.py": "from shared import specs\n",
        # The job's aggregator: a clock, and the script's plugin.
        "hops/aggregator/probe_clock.py": "import time\n",
        "hops/aggregator/probe_plugin.py": "from hops.plugin import micro\n",
        # The task trainer's library: the environment, and the script's plugin.
        "hops/trainer/probe_env.py": "import os\n",
        "hops/trainer/probe_plugin.py": "from hops.plugin import micro\n",
    }
    for path, text in bad.items():
        (tmp_path / path).write_text(text)
    # An experiment's pure rule reaching its run (a shell that writes files).
    with (tmp_path / "experiments/sharing/cluster.py").open("a") as rule:
        rule.write("from experiments.sharing import run as _run\n")
    # The trainers' choice rule reaching the pool that runs the processes.
    with (tmp_path / "executor/trainer_choice.py").open("a") as rule:
        rule.write("from executor import trainers as _pool\n")
    rc, out = _lint(tmp_path)
    assert rc != 0, out
    for broken in ("shared is not allowed to import time",
                   "simulator is not allowed to import nats",
                   "scheduling is not allowed to import services.scheduler:",
                   "shared is not allowed to import gateway",
                   "simulator is not allowed to import asyncio",
                   "world is not allowed to import time",
                   "world is not allowed to import simulator",
                   "hops is not allowed to import scheduling",
                   "hops is not allowed to import shared.specs",
                   "hops.aggregator is not allowed to import time",
                   "hops.aggregator is not allowed to import hops.plugin",
                   "hops.trainer is not allowed to import os",
                   "hops.trainer is not allowed to import hops.plugin",
                   "executor.trainer_choice is not allowed to import executor.trainers",
                   "experiments.sharing.cluster is not allowed to import "
                   "experiments.sharing.run"):
        assert broken in out, out
    assert "simulator.probe_indirect -> services.scheduler.probe_helper" in out, out
    assert "hops.plugin.probe_scheduler -> scheduling.registry" in out, out


def _pattern(expression: str) -> re.Pattern[str]:
    # import-linter's module expressions: `*` is one name, `**` any number.
    parts = [r"[^.]+" if p == "*" else r".+" if p == "**" else re.escape(p)
             for p in expression.split(".")]
    return re.compile(r"\.".join(parts) + r"(\..+)?")


def _within(module: str, modules: list[str]) -> bool:
    return any(module == m or module.startswith(m + ".") for m in modules)


def test_every_pure_module_is_in_the_contract() -> None:
    """A module of `services/` or `gateway/` that reaches nothing the core may
    not import is pure, and then the contract must name it: otherwise a later
    change could give it a clock or a bus unnoticed. A failure here means:
    add the module to `source_modules` in pyproject.toml (or give the shell
    it belongs to its import)."""
    core = _contract("core")
    forbidden = [_pattern(e) for e in core["forbidden_modules"]]
    listed = [*core["source_modules"], *_contract("gateway-pure")["source_modules"]]
    graph = grimp.build_graph(*_config()["root_packages"],
                              include_external_packages=True, cache_dir=None)

    def is_shell(module: str) -> bool:
        return any(p.fullmatch(module) for p in forbidden)

    unlisted = sorted(
        m for m in graph.modules
        if _within(m, ["services", "gateway"])
        and not graph.find_children(m)  # packages' __init__ modules
        and not _within(m, listed)
        and not is_shell(m)
        and not any(is_shell(u) for u in graph.find_upstream_modules(m))
    )
    assert unlisted == [], f"pure modules missing from the import contract: {unlisted}"


def test_the_gateway_keeps_the_core_rule() -> None:
    # The gateway's pure modules may import each other, and nothing else the
    # core may not.
    core = set(_contract("core")["forbidden_modules"]) - {"gateway"}
    assert core <= set(_contract("gateway-pure")["forbidden_modules"])


def test_every_package_is_analysed() -> None:
    # A top-level package that the checker does not analyse is invisible to
    # it: a core module could reach a shell through it unnoticed.
    with (ROOT / "pyproject.toml").open("rb") as f:
        find: dict[str, list[str]] = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    installed = {p.rstrip("*") for p in find["include"]}
    assert installed == set(_config()["root_packages"])


def test_the_plugin_contract_leaves_only_the_job_contract_allowed() -> None:
    """Every module of `shared/` is either one the plugin reaches today or
    named as forbidden to it: a new shared module fails this until it is
    named in the contract, so the plugin's allowed set cannot grow unseen."""
    forbidden = set(_contract("plugin")["forbidden_modules"])
    graph = grimp.build_graph(*_config()["root_packages"], cache_dir=None)
    reached: set[str] = set()
    for module in graph.find_descendants("hops"):
        reached |= graph.find_upstream_modules(module)
    shared = graph.find_descendants("shared")
    assert shared - reached - forbidden == set()
    assert {"shared.jobenv", "shared.jobreport", "shared.relaxed"} <= reached
    first_party = set(_config()["root_packages"]) - {"hops", "shared"}
    assert first_party <= forbidden
