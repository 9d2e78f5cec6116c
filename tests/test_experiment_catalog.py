"""``hops experiment NAME`` looks NAME up in the experiments' table
(:data:`experiments.catalog.EXPERIMENTS`)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli.experiment_command import EXPERIMENTS_HELP
from cli.main import app
from experiments.catalog import EXPERIMENTS


def test_an_unknown_experiment_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["experiment", "table5", "--out", str(tmp_path)])
    assert done.exit_code == 2, done.output
    assert "unknown experiment 'table5'" in done.output
    for name, entry in EXPERIMENTS.items():
        assert f"{name}: {entry.help}" in done.output
    assert not any(tmp_path.iterdir())


def test_the_commands_help_names_every_experiment() -> None:
    # The command's help is written out (the CLI does not import the
    # experiments to print it); it must still name each one of the table.
    words = EXPERIMENTS_HELP.replace(",", " ").split()
    assert all(name in words for name in EXPERIMENTS), (EXPERIMENTS_HELP, list(EXPERIMENTS))


def test_only_the_papers_workloads_take_a_generator() -> None:
    takes = {name for name, entry in EXPERIMENTS.items() if entry.generator}
    assert takes == {"table3", "table4", "priorities", "arrival-rates", "elasticflow",
                     "traces"}
