"""Every line a service writes is JSON, the solver's included.

HiGHS prints a plain-text banner (``Running HiGHS ...``) on the process's
stdout the first time a solver is set up with output on, from C, where no
Python logging configuration can catch it. Each policy runs here in a
process of its own, as the scheduler does, with the services' JSON logging;
every line it writes, on stdout and stderr, must parse as a JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# One round of each policy on the demo jobs, logged as a service logs, plus
# a bare LP relaxation (the warm start's path) and a Python warning, which
# would be printed as plain text too, in the same process.
SCRIPT = """
import sys
import warnings
from services.runtime.logging import configure_logging

log = configure_logging("scheduler")
log.info("planning", policy=sys.argv[1])
warnings.warn("a library's warning", UserWarning, stacklevel=1)
from cli.offline_commands import DEFAULT_CLUSTER, DEFAULT_JOBS, DEFAULT_PROFILES
from cli.oneshot import load_snapshot
from cli.policies import make_policy
from scheduling.ilp import MipModel, solve_relaxation

snap = load_snapshot(DEFAULT_CLUSTER, DEFAULT_JOBS, DEFAULT_PROFILES)
plan = make_policy(sys.argv[1]).plan(snap)
model = MipModel()
row = model.add_row(0.0, 1.0)
model.add_col(1.0, 0.0, 1.0, integer=True, rows=[row], values=[1.0])
values, _ = solve_relaxation(model)
log.info("planned", assignments=len(plan.assignments), relaxed=list(values or []))
"""


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("policy", ["hops", "sia", "gavel"])
def test_a_process_that_solves_writes_only_json_lines(policy: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, policy], cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    out, err = _lines(done.stdout), _lines(done.stderr)
    for line in out + err:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert isinstance(record, dict) and "event" in record, line
    assert not err, "the services log on stdout only"
    records = [json.loads(line) for line in out]
    assert [r.get("logger", r["event"]) for r in records] == ["planning", "py.warnings", "planned"]
    assert "a library's warning" in records[1]["event"] and records[1]["level"] == "warning"
    assert records[-1]["assignments"] > 0


def test_each_line_is_written_at_once_so_processes_sharing_a_file_never_merge_two(
        tmp_path: Path) -> None:
    """``hops up`` runs a server's executors with PYTHONUNBUFFERED, all on one
    log file: a line written in two calls (its text, then its newline) let
    another process's line land between them, two JSON objects on one line."""
    script = """
import os, sys
from services.runtime.logging import configure_logging

log = configure_logging("executor")
for i in range(2000):
    log.info("task done", writer=sys.argv[1], i=i, pad="x" * 200)
"""
    out = tmp_path / "cluster.log"
    with out.open("w") as f:
        procs = [subprocess.Popen([sys.executable, "-c", script, str(w)], cwd=ROOT, stdout=f,
                                  env={"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
                 for w in range(3)]
        assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    lines = out.read_text().splitlines()
    assert len(lines) == 6000 and all(json.loads(line)["event"] == "task done" for line in lines)
