"""``hops jobs``: the tenant, submission time, wait, run time and restarts
columns, and ``--sort``, from answers of the gateway's ``GET /jobs``."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.client import render_jobs
from cli.jobs_view import SORTS, duration, sort_jobs, when
from cli.main import app


def job(job_id: str, submitted: float, waited: float, ran: float, restarts: int,
        tenant: str = "alpha") -> dict[str, Any]:
    return {"job_id": job_id, "phase": "running", "samples_done": 0.0, "restarts": restarts,
            "spec": {"model": "m", "total_samples": 100, "tenant": tenant},
            "submitted_at": submitted, "waited_s": waited, "ran_s": ran, "reason": ""}


JOBS = [job("a", 100.0, 5.0, 3725.0, 1), job("b", 200.0, 130.0, 42.0, 3, "beta"),
        job("c", 300.0, 130.0, 0.0, 0)]


def test_the_table_shows_tenant_submitted_waited_ran_and_restarts() -> None:
    lines = render_jobs({"jobs": JOBS}).splitlines()
    assert lines[0].split() == ["job", "tenant", "phase", "model", "done", "gpus", "submitted",
                                "waited", "ran", "restarts", "reason"]
    assert lines[1].split() == ["a", "alpha", "running", "m", "0.0%", "-",
                                *when(100.0).split(), "5s", "1h02m", "1"]
    assert lines[2].split()[1] == "beta" and lines[2].split()[-3:] == ["2m10s", "42s", "3"]


def test_durations_and_times() -> None:
    assert [duration(s) for s in (0, 59.4, 60, 3599, 3600, 86399, 90000)] == [
        "0s", "59s", "1m00s", "59m59s", "1h00m", "23h59m", "1d01h"]
    assert duration(None) == "-" and when(None) == "-"
    assert when(1e9) == time.strftime("%m-%d %H:%M:%S", time.localtime(1e9))


@pytest.mark.parametrize(("by", "order"), [
    ("submitted", ["a", "b", "c"]), ("id", ["a", "b", "c"]), ("waited", ["b", "c", "a"]),
    ("ran", ["a", "b", "c"]), ("restarts", ["b", "a", "c"]),
])
def test_sort_keys(by: str, order: list[str]) -> None:
    shuffled = [JOBS[2], JOBS[0], JOBS[1]]
    assert [j["job_id"] for j in sort_jobs(shuffled, by)] == order


def test_an_unknown_sort_key_is_refused_before_the_gateway_is_asked() -> None:
    with pytest.raises(ValueError, match="unknown sort key 'age'; expected one of: submitted"):
        sort_jobs(JOBS, "age")
    result = CliRunner().invoke(app, ["jobs", "--sort", "age"],
                                env={"HOPS_GATEWAY_URL": "http://127.0.0.1:1"})
    assert result.exit_code == 1
    assert f"unknown sort key 'age'; expected one of: {', '.join(SORTS)}" in result.output
    assert "cannot reach" not in result.output


def test_sort_and_json_against_a_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sort`` orders the table and ``--json`` alike; the JSON carries the
    fields the table shows."""
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/jobs"
        return httpx.Response(200, json={"jobs": JOBS, "count": 3, "total": 3,
                                         "next_cursor": None})

    real = httpx.Client

    def mocked(*args: Any, **kwargs: Any) -> httpx.Client:
        return real(*args, **{**kwargs, "transport": httpx.MockTransport(answer)})

    monkeypatch.setattr(httpx, "Client", mocked)
    env = {"HOPS_GATEWAY_URL": "http://gateway.test"}
    table = CliRunner().invoke(app, ["jobs", "--sort", "waited"], env=env)
    assert table.exit_code == 0, table.output
    assert [line.split()[0] for line in table.output.splitlines()[1:]] == ["b", "c", "a"]
    listed = CliRunner().invoke(app, ["jobs", "--sort", "restarts", "--json"], env=env)
    body = json.loads(listed.output)
    assert [j["job_id"] for j in body["jobs"]] == ["b", "a", "c"]
    first = body["jobs"][0]
    assert (first["spec"]["tenant"], first["submitted_at"], first["waited_s"], first["ran_s"],
            first["restarts"]) == ("beta", 200.0, 130.0, 42.0, 3)
