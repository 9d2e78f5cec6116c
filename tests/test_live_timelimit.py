"""Per-job time limits on the real stack (nats-server, every service and an
emulated cluster, each its own process): a job with a short ``time_limit``
is stopped by the leader with a checkpointing stop and ends ``cancelled``
with the reason ``TimeLimit``, its progress kept in the record and its GPUs
released for the next job; ``hops jobs`` and ``GET /jobs/{id}`` show the
limit; bad limits are refused 422 naming the field, by the gateway and by
``hops submit``, and change nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.helpers import catalog_spec, timeline_of
from tests.livestack import LiveStack, until

CLUSTER = """\
name: limits
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
"""
NEVER = 10**13  # samples: a job that runs until something stops it
SHORT = 10_000_000  # a second or two of wall time at x600
LIMIT_S = 4.0


def spec(job_id: str, total: int = NEVER, **extra: Any) -> dict[str, Any]:
    return {**catalog_spec(job_id, total, requirements=[4]), **extra}  # the whole cluster


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("limits"), CLUSTER) as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as client:
        yield client


def hops(stack: LiveStack, *args: str) -> Any:
    env = {"HOPS_GATEWAY_URL": stack.config.gateway_url, "HOPS_TOKEN": stack.admin_token}
    return CliRunner().invoke(app, list(args), env=env)


def test_a_job_over_its_time_limit_is_stopped_with_reason_timelimit(
    stack: LiveStack, api: httpx.Client
) -> None:
    r = api.post("/jobs", json=spec("slow", time_limit=LIMIT_S))
    assert r.status_code == 201, r.text
    until(lambda: stack.phase("slow") == "running", "slow runs", 60, stack.logs)
    started = time.time()
    assert api.get("/jobs/slow").json()["spec"]["time_limit"] == LIMIT_S
    # The next job waits for the GPUs the first holds until its limit.
    assert api.post("/jobs", json=spec("next", SHORT)).status_code == 201
    until(lambda: stack.phase("slow") == "cancelled", "slow ended at its limit", 30,
          stack.logs)
    # never before its limit; within a few seconds after it (the stop's own time)
    assert time.time() - started >= LIMIT_S - 0.5
    record = api.get("/jobs/slow").json()
    assert record["reason"] == "TimeLimit", record
    assert record["samples_done"] > 0, record  # its progress is kept
    ended = [e.body for e in stack.bus_().job_events("slow", "job_cancelled")]
    assert [e.get("reason") for e in ended] == ["TimeLimit"], ended
    # its GPUs are released: the next job runs on them and finishes
    until(lambda: "slow" not in stack.allocs(), "slow's GPUs released", 30, stack.logs)
    assert stack.wait_final(["next"], 90) == {"next": "finished"}
    table = hops(stack, "jobs")
    assert table.exit_code == 0, table.output
    head, *rows = table.output.splitlines()
    assert "limit" in head.split(), table.output
    slow = next(r.split() for r in rows if r.split()[0] == "slow")
    assert slow[2] == "cancelled" and slow[-1] == "TimeLimit" and "4s" in slow, slow
    # its timeline, kept after its end: the stop's receipt names the rule and
    # the progress it kept, then the cancel ends it
    entries = timeline_of(stack.bus_().stored, "slow")
    kinds = [e["kind"] for e in entries]
    assert kinds[0] == "submitted" and "cancelled" in kinds, kinds
    (stop,) = [e for e in entries if e["kind"] == "stopped"]
    receipt = stop["receipt"]
    assert receipt["rule"] == "TimeLimit" and "time limit" in receipt["message"], receipt
    assert receipt["total_samples"] == NEVER, receipt
    assert kinds.index("started") < kinds.index("stopped"), kinds


@pytest.mark.parametrize("bad", [0, -10, 365 * 86400 + 1])
def test_a_bad_time_limit_is_refused_naming_the_field(
    stack: LiveStack, api: httpx.Client, tmp_path: Path, bad: float
) -> None:
    before = set(stack.bus_().bucket("hops_jobs"))
    r = api.post("/jobs", json=spec("bad-limit", time_limit=bad))
    assert (r.status_code, r.json()["code"]) == (422, "invalid"), r.text
    assert "time_limit" in r.json()["error"], r.text
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - {spec('bad-file', time_limit=bad)}\n")
    result = hops(stack, "submit", str(jobs))
    assert result.exit_code == 1 and "time_limit" in result.output, result.output
    assert set(stack.bus_().bucket("hops_jobs")) == before
