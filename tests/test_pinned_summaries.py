"""The simulator's summaries of a reduced Table 3 and Table 4 run of every
policy of the registry, pinned to the last digit (tests/data/pinned-summaries.json).

A refactoring of the core (the policy stack, the job lifecycle, resources)
must not change a single schedule: any difference here is a change of
behaviour, to be made on purpose and explained. Wall-clock fields
(``planner_*``) are left out; every solve ends well inside its time limit,
so the schedules do not depend on the machine's speed. To re-pin after an
intended change, regenerate the file with :func:`summaries` and say why in
the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hops.policies import POLICIES
from hops.simrun import RunSpec, simulate
from simulator.metrics import summarize

PINNED = Path(__file__).parent / "data" / "pinned-summaries.json"
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


def test_every_policy_of_the_registry_is_pinned() -> None:
    assert set(json.loads(PINNED.read_text())) == {f"{t}/{p}" for t in RUNS for p in POLICIES}


@pytest.mark.parametrize("run", sorted(json.loads(PINNED.read_text())))
def test_a_reduced_run_gives_the_pinned_summary(run: str) -> None:
    table, policy = run.split("/")
    assert summary(table, policy) == json.loads(PINNED.read_text())[run]
