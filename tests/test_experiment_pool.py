"""Every ``hops experiment`` hands its independent simulations to one pool
(:func:`experiments.common.pool.run_all`): ``--workers N`` runs them in N
local processes, ``--ray local`` on a private Ray on loopback, and either
writes what the serial run writes to the last digit (the planner's wall
times aside)."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from experiments.cellfrag.run import run_cell_fragmentation
from experiments.cellfrag.stress import StressSettings
from experiments.common.pool import HERE, Pool, PoolError, run_all
from experiments.common.suite import run_experiment
from experiments.tables.define import define
from simulator.engine import Progress
from tests.engines import require
from tests.test_ray_experiment import HAS_RAY

# Outputs that differ between any two runs: the planner's wall times.
TIMED = ("planner_p95_s", "planner_median_s", "planner_max_s", "planner_s")
SMALL = ("experiment", "table3", "--first-n", "8", "--policy", "hops", "--policy", "gavel",
         "--no-progress")


def _untimed(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return [{k: v for k, v in row.items() if k not in TIMED} for row in csv.DictReader(fh)]


def _same_outputs(here: Path, there: Path) -> None:
    """``there`` holds what ``here`` does, every digit, the timings aside."""
    ours, theirs = (json.loads((d / "results.json").read_text()) for d in (here, there))
    assert list(theirs) == list(ours)
    for label, summary in ours.items():
        assert {k: v for k, v in theirs[label].items() if k not in TIMED} == {
            k: v for k, v in summary.items() if k not in TIMED}, label
    runs = sorted(p.parent.name for p in here.glob("*/jobs.csv"))
    assert runs == sorted(p.parent.name for p in there.glob("*/jobs.csv")) and runs
    for run in runs:
        assert (there / run / "jobs.csv").read_bytes() == (here / run / "jobs.csv").read_bytes()
        assert (there / run / "reasons.json").read_bytes() == (
            here / run / "reasons.json").read_bytes()
        assert _untimed(there / run / "rounds.csv") == _untimed(here / run / "rounds.csv")


def test_two_workers_write_what_the_serial_run_writes(tmp_path: Path) -> None:
    exp = define("table3", first_n=10, policies=("hops", "gavel", "sia"))
    serial = run_experiment(exp, tmp_path / "one")
    shown: list[str] = []

    def progress(label: str) -> tuple[Progress | None, Callable[[], None]]:
        shown.append(label)
        return None, lambda: None

    parallel = run_experiment(exp, tmp_path / "two", progress, pool=Pool(workers=2))
    assert list(parallel) == ["hops", "gavel", "sia"] == list(serial)
    assert shown == []  # no progress bars from worker processes
    assert {r["jobs_finished"] for r in serial.values()} == {10}
    _same_outputs(tmp_path / "one", tmp_path / "two")


def test_the_serial_pool_runs_here_in_order_and_the_parallel_one_in_workers() -> None:
    calls = {k: (k,) for k in (3, 1, 2)}
    seen: list[int] = []
    here = run_all(HERE, abs, calls, done=seen.append, here=lambda k: -k)
    assert here == {3: -3, 1: -1, 2: -2} and list(here) == [3, 1, 2] and seen == [3, 1, 2]
    away = run_all(Pool(workers=2), abs, {k: (-k,) for k in (3, 1, 2)}, here=lambda k: 0)
    assert away == {3: 3, 1: 1, 2: 2} and list(away) == [3, 1, 2]


def test_cell_fragmentation_steps_run_at_once_with_the_serial_figures(tmp_path: Path) -> None:
    s = StressSettings(quotas={"res-f": 4, "prod-e": 2, "rest-a": 2}, steps=("res-f", "prod-e"),
                       days=3.0)
    serial = run_cell_fragmentation(tmp_path / "one", s)
    assert run_cell_fragmentation(tmp_path / "two", s, Pool(workers=2)) == serial
    assert [st["wide"] for st in serial] == [["res-f"], ["prod-e", "res-f"]]
    assert (tmp_path / "two" / "results.md").read_text() == (
        tmp_path / "one" / "results.md").read_text()


def test_the_command_takes_workers_for_the_papers_tables(tmp_path: Path) -> None:
    one = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path / "one")])
    two = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path / "two"), "--workers", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    _same_outputs(tmp_path / "one", tmp_path / "two")


def test_fewer_than_one_worker_is_refused_with_its_code(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path / "out"), "--workers", "0"])
    assert done.exit_code == 2, done.output
    assert "error (bad_workers): --workers must be at least 1, not 0" in done.output
    assert not (tmp_path / "out").exists()
    with pytest.raises(PoolError):
        Pool(workers=-1)


def test_ray_missing_is_refused_naming_the_package(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails
    done = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path / "out"), "--ray", "local"])
    assert done.exit_code == 2, done.output
    assert "error (ray_missing): --ray needs Ray" in done.output
    assert "hops-scheduler[ray]" in done.output
    assert not (tmp_path / "out").exists()


def test_a_private_ray_on_loopback_writes_what_the_serial_run_writes(tmp_path: Path) -> None:
    require("Ray", HAS_RAY, "install hops-scheduler[ray] (make test's dev extra has it)")
    one = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path / "one")])
    ray = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path / "ray"), "--ray", "local",
                                   "--workers", "2"])
    assert one.exit_code == 0 and ray.exit_code == 0, (one.output, ray.output)
    _same_outputs(tmp_path / "one", tmp_path / "ray")
