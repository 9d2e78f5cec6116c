"""The simulator's summaries of a reduced Table 3 and Table 4 run of every
policy of the registry, pinned to the last digit (tests/data/pinned-summaries.json).

A refactoring of the core (the policy stack, the job lifecycle, resources)
must not change a single schedule: any difference here is a change of
behaviour, to be made on purpose and explained. Wall-clock fields
(``planner_*``) are left out; every solve ends well inside its time limit,
so the schedules do not depend on the machine's speed. To re-pin after an
intended change, regenerate the file with :func:`summaries` and say why in
the commit.

The schedules also depend on the solver (HiGHS) and numpy: the Table 4 runs
differ under highspy 1.15.1 and 1.16.0. tests/data/pinned-versions.json records
the versions the pins were made with, which must be the versions
``constraints.txt`` pins for ``make`` (docs/results.md, "Reproducible
results"); a failure names both, so that a dependency bump that moves results
is seen. Bumping one: change the pin (``make lock``), rerun, and re-pin the
summaries and the versions together if they moved.
"""

from __future__ import annotations

import json
import platform
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from cli.policies import POLICIES
from experiments.common.simrun import RunSpec, simulate
from simulator.metrics import summarize

PINNED = Path(__file__).parent / "data" / "pinned-summaries.json"
VERSIONS = Path(__file__).parent / "data" / "pinned-versions.json"
CONSTRAINTS = Path(__file__).parent.parent / "constraints.txt"
SOLVER = ("highspy", "numpy", "msgspec")  # the distributions the schedules depend on
RUNS = {  # table: (cluster, workload, first_n)
    "table3": ("paper-physical", "paper-physical", 30),
    "table4": ("paper-sim-512", "paper-sim", 40),
}


def summary(table: str, policy: str) -> dict[str, object]:
    cluster, workload, first_n = RUNS[table]
    spec = RunSpec(cluster=cluster, workload=workload, policy=policy, first_n=first_n)
    used, result = simulate(spec)
    return {k: v for k, v in summarize(result, used).items() if not k.startswith("planner_")}


def summaries() -> dict[str, dict[str, object]]:
    return {f"{t}/{p}": summary(t, p) for t in RUNS for p in POLICIES}


def installed() -> dict[str, str]:
    """This install's versions of what pinned-versions.json records."""
    found = {name: version(name).split("+")[0] for name in SOLVER}
    return {**found, "python": ".".join(platform.python_version_tuple()[:2])}


def constraints() -> dict[str, str]:
    """constraints.txt's pins, by normalised distribution name."""
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = pinned.split("+")[0]
    return pins


def versions_line(pinned: dict[str, str], here: dict[str, str]) -> str:
    keys = ("highspy", "numpy", "msgspec", "python")
    return (f"pinned with {' / '.join(f'{k} {pinned[k]}' for k in keys)}; "
            f"this install has {' / '.join(f'{k} {here[k]}' for k in keys)}")


def test_every_policy_of_the_registry_is_pinned() -> None:
    assert set(json.loads(PINNED.read_text())) == {f"{t}/{p}" for t in RUNS for p in POLICIES}


@pytest.mark.parametrize("run", sorted(json.loads(PINNED.read_text())))
def test_a_reduced_run_gives_the_pinned_summary(run: str) -> None:
    table, policy = run.split("/")
    got, pinned = summary(table, policy), json.loads(PINNED.read_text())[run]
    if got != pinned:
        moved = {k: (pinned.get(k), got.get(k)) for k in sorted(set(got) | set(pinned))
                 if got.get(k) != pinned.get(k)}
        here, then = installed(), json.loads(VERSIONS.read_text())
        cause = ("a change of behaviour" if here == then
                 else "the versions differ, which may be the cause")
        pytest.fail(f"{run} moved ({cause}): {versions_line(then, here)}; "
                    f"(pinned, now) = {moved}")


def test_the_summaries_are_pinned_with_the_versions_make_installs() -> None:
    # A bump of the solver in constraints.txt must come with a rerun of this module
    # and pinned-versions.json updated (and the summaries re-pinned if they moved).
    pins, then = constraints(), json.loads(VERSIONS.read_text())
    locked, pinned = {k: pins.get(k) for k in SOLVER}, {k: then[k] for k in SOLVER}
    assert locked == pinned, (
        f"constraints.txt pins {locked}, the summaries were pinned with {pinned}: "
        "rerun this module under the new pins, re-pin what moved, update pinned-versions.json")


def test_the_install_has_the_constraints_pins() -> None:
    # An install that drifted from the lock is seen even where no summary happens to move.
    pins, here = constraints(), installed()
    drift = {k: (pins.get(k), here[k]) for k in SOLVER if pins.get(k) != here[k]}
    assert not drift, (
        f"(constraints.txt, installed) = {drift}: reinstall with "
        "`pip install -c constraints.txt -e '.[dev]'` (what `make` runs)")
