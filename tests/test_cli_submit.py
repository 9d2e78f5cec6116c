"""``hops submit`` checks the whole file before it sends anything.

Against a real nats-server, the real scheduler process and a ``python -m
gateway`` process: a file with invalid jobs among valid ones gets one line
per invalid job and sends nothing (exit 1); ``--skip-invalid`` sends the valid
ones and still exits 1; ``--dry-run`` sends nothing either way.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app as hops_app
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import needs_scheduler, scheduler
from tests.test_gateway_jobs import gateway

__all__ = ["gateway", "nats_server", "nats_url", "scheduler"]  # fixtures

JOB = "model: resnet50, batch_size: 32, params: 25557032, total_samples: 1000000,"
FILE = f"""\
jobs:
  - {{id: ok-1, {JOB} requirements: [1, 2]}}
  - {{id: bad.id, {JOB} requirements: [1]}}
  - {{id: ok-2, {JOB} min_gpus: 1, max_gpus: 4}}
  - {{id: zero, {JOB} requirements: [1], batch_size: 0}}
  - {{id: nop, model: m, batch_size: 8, total_samples: 100, requirements: [1]}}
  - {{id: typo, {JOB} requirements: [1], tennant: a}}
  - {{id: ok-1, {JOB} requirements: [1]}}
  - just a string
  - {{id: huge, {JOB} requirements: [5000]}}
  - {{id: twice, {JOB} requirements: [2, 2]}}
  - {{id: unsorted, {JOB} requirements: [4, 1]}}
  - {{id: eons, model: m, batch_size: 8, params: 10, total_samples: {10**30}, requirements: [1]}}
  - {{id: many, {JOB} requirements: [{", ".join(map(str, range(1, 66)))}]}}
"""
# Every entry a JobSpec, one id unusable live: this file used to get ok-1
# accepted, then a traceback, and ok-2 never sent.
ONE_BAD_ID = f"""\
- {{id: ok-1, {JOB} requirements: [1]}}
- {{id: "bad id", {JOB} requirements: [1]}}
- {{id: ok-2, {JOB} requirements: [1]}}
"""
# index, id, field, and words of the problem, for each invalid entry
INVALID = [
    (1, "'bad.id'", "id", "may only contain letters, digits"),
    (3, "'zero'", "batch_size", "batch_size must be > 0, got 0"),
    (4, "'nop'", "params", "this required field is missing"),
    (5, "'typo'", "tennant", "not a field of a job spec"),
    (6, "'ok-1'", "id", "job id 'ok-1' appears again (first at jobs[0])"),
    (7, "no id", "(entry)", "expected a mapping of job fields, got str"),
    (8, "'huge'", "requirements", "at most 4096 are allowed"),
    (9, "'twice'", "requirements", "repeats [2]"),
    (10, "'unsorted'", "requirements", "write the set sorted, as [1, 4]"),
    (11, "'eons'", "total_samples", "at most 1000000000000000 (1e15)"),
    (12, "'many'", "requirements", "lists 65 entries"),
]


def hops(gateway: str, *args: str) -> Any:
    return CliRunner().invoke(hops_app, ["submit", *args], env={"HOPS_GATEWAY_URL": gateway})


def until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.1)


def listed(gateway: str) -> list[str]:
    return [j["job_id"] for j in httpx.get(f"{gateway}/jobs", timeout=5).json()["jobs"]]


def check_invalid_lines(output: str) -> None:
    lines = [line for line in output.splitlines() if line.startswith("jobs.yaml: jobs[")]
    assert len(lines) == len(INVALID), output
    for line, (index, name, field, words) in zip(lines, INVALID, strict=True):
        id_part = name if name == "no id" else f"id {name}"
        assert line.startswith(f"jobs.yaml: jobs[{index}] ({id_part}), field {field}: "), line
        assert words in line, line


@needs_scheduler
def test_invalid_jobs_are_listed_and_nothing_is_sent(
    gateway: str, scheduler: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    # the scheduler admits once it is up: a malformed body is then a 400
    until(lambda: httpx.post(f"{gateway}/jobs", content=b"{", timeout=5).status_code == 400)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(ONE_BAD_ID)
    held = hops(gateway, str(jobs))
    assert held.exit_code == 1 and isinstance(held.exception, SystemExit), held.output
    assert held.output.splitlines()[0].startswith("jobs.yaml: jobs[1] (id 'bad id'), field id:")
    assert listed(gateway) == []

    jobs.write_text(FILE)
    for args in ([str(jobs)], [str(jobs), "--dry-run"]):
        held = hops(gateway, *args)
        assert held.exit_code == 1 and isinstance(held.exception, SystemExit), held.output
        check_invalid_lines(held.output)
        assert "11 of 13 jobs are invalid; nothing sent" in held.output
        assert listed(gateway) == []

    sent = hops(gateway, str(jobs), "--skip-invalid")
    assert sent.exit_code == 1 and isinstance(sent.exception, SystemExit), sent.output
    check_invalid_lines(sent.output)
    assert "ok-1: accepted" in sent.output and "ok-2: accepted" in sent.output
    assert "11 invalid jobs were not sent" in sent.output
    until(lambda: listed(gateway) == ["ok-1", "ok-2"])


def test_a_valid_file_checked_with_dry_run_exits_0(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"- {{id: a, {JOB} requirements: [1]}}\n")
    checked = hops("http://127.0.0.1:1", str(jobs), "--dry-run")
    assert checked.exit_code == 0 and "all 1 jobs are valid; nothing sent" in checked.output


@pytest.mark.parametrize(("text", "words"), [
    ("jobs: [", "cannot read spec"),
    ("jobs: {a: 1}", "expected a list of jobs"),
    ("name: x\njobs: []", "expected a list of jobs"),
    ("jobs: []", "jobs.yaml: the file holds no jobs; nothing to submit"),
    ("[]", "the file holds no jobs"),
])
def test_a_file_that_is_no_list_of_jobs_exits_2(tmp_path: Path, text: str, words: str) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(text)
    result = hops("http://127.0.0.1:1", str(jobs))
    assert result.exit_code == 2 and words in result.output
