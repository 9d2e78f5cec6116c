"""``hops describe``, the REASON of ``hops jobs`` and the POSITION, START
and FINISH of ``hops queue``, from answers the gateway's own views make
(gateway.views, gateway.explain_view) of a job's record and its
hops_explain entry."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest
from typer.testing import CliRunner

from cli.describe import render_describe
from cli.jobs_view import estimate, relative, span
from cli.main import app
from cli.tables import render_jobs, render_queue
from gateway import views
from gateway.explain_view import Viewer, explain_fields, timeline_view
from shared.explain import (
    ANOTHER_TENANT,
    JobExplain,
    JobForecast,
    Receipt,
    TimelineEntry,
    WhatIf,
    Why,
)
from shared.ids import JobId
from shared.job import JobSpec
from shared.records import JobRecord

NOW = 1_000_000.0
WHY = Why(code="Priority", message="higher-priority jobs took the GPUs it needs",
          jobs=(JobId("bob/b1"),), ratios=(1.5,), since=NOW - 60)
RECEIPT = Receipt(job_id=JobId("alice/j1"), at=NOW - 300, rule="Fairness",
                  message="the round's first plan gave its GPUs to others",
                  takers=(JobId("bob/b1"),), samples_kept=400.0, total_samples=1000.0)
FORECAST = JobForecast(
    job_id=JobId("alice/j1"), position=2, tenant_position=1, start=NOW + 720,
    start_lo=NOW + 480, start_hi=NOW + 1200, finish=NOW + 7200, finish_lo=NOW + 6000,
    finish_hi=NOW + 9000,
    whatif=(WhatIf(kind="smaller", message="with at most 1 GPU", start=NOW + 60,
                   finish=NOW + 9000, max_gpus=1),))


def job_body() -> dict[str, Any]:
    spec = JobSpec(id=JobId("alice/j1"), model="resnet50", batch_size=32, params=1,
                   total_samples=1000, tenant="alice", requirements=(1, 2))  # type: ignore[arg-type]
    record = JobRecord(spec=spec, submitted_at=NOW - 900, phase="queued", samples_done=400.0,
                       first_start=NOW - 800, restarts=1)
    explain = JobExplain(job_id=JobId("alice/j1"), at=NOW - 5, why=WHY, receipt=RECEIPT,
                         forecast=FORECAST, estimated_throughput=120.0,
                         measured_throughput=102.0)
    body = views.job_view(record, NOW)
    body.update(explain_fields(record, explain, Viewer(tenant="alice")))
    return msgspec.json.decode(msgspec.json.encode(body))  # as it comes over HTTP


def timeline_body() -> dict[str, Any]:
    entries = [TimelineEntry(job_id=JobId("alice/j1"), at=NOW - 900, kind="submitted"),
               TimelineEntry(job_id=JobId("alice/j1"), at=NOW - 300, kind="stopped",
                             receipt=RECEIPT),
               TimelineEntry(job_id=JobId("alice/j1"), at=NOW - 60, kind="reason", why=WHY)]
    shown = timeline_view(entries, Viewer(tenant="alice"))
    return {"job_id": "j1", "entries": shown, "count": len(shown), "truncated": False}


def test_times_from_now_are_short_and_carry_the_interval() -> None:
    assert [span(s) for s in (42, 720, 3900, 2 * 86400 + 3 * 3600)] == [
        "42s", "12m", "1h05m", "2d03h"]
    assert relative(NOW + 720, NOW) == "in 12m" and relative(NOW - 300, NOW) == "5m ago"
    assert relative(NOW, NOW) == "now"
    assert estimate(msgspec.to_builtins(FORECAST), "start", NOW) == "in 12m (8m–20m)"
    started = {"start": NOW + 30, "start_lo": NOW - 10, "start_hi": NOW + 90}
    assert estimate(started, "start", NOW) == "in 30s (now–2m)"
    assert estimate(None, "finish", NOW) == "-" and estimate({"start": 0.0}, "start", NOW) == "-"


def test_describe_shows_reason_forecast_whatif_receipt_conditions_and_timeline() -> None:
    text = render_describe(job_body(), timeline_body(), NOW)
    lines = text.splitlines()
    assert lines[0].split() == ["Name:", "j1"] and lines[1].split() == ["Tenant:", "alice"]
    assert "b1" not in text and "bob" not in text
    assert (f"Reason:       Priority: higher-priority jobs took the GPUs it needs: "
            f"{ANOTHER_TENANT}") in text
    assert "Throughput:   estimated 120 samples/s, measured 102 samples/s (-15%)" in text
    assert "Forecast:     position 2 (1 in its tenant)" in text
    assert "  Start:      in 12m (8m–20m)" in text
    assert "  Finish:     in 2h00m (1h40m–2h30m)" in text
    assert "  smaller: with at most 1 GPU (start in 1m, finish in 2h30m)" in text
    assert "Last stop:    Fairness at" in text and "kept 400 of 1000 samples" in text
    conditions = {line.split()[0]: line.split()[1:3] for line in lines
                  if line.startswith("  ") and line.split()[0] in ("Scheduled", "Preempted")}
    assert conditions == {"Scheduled": ["False", "Priority"], "Preempted": ["True", "Fairness"]}
    timeline = lines[lines.index("Timeline:") + 2:]
    assert [line.split()[2] for line in timeline] == ["submitted", "stopped", "reason"]
    assert "Fairness: the round's first plan" in timeline[1]
    assert "(not available" in render_describe(job_body(), None, NOW)


def test_the_describe_command_against_a_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url.path}?{request.url.query.decode()}")
        if request.url.path == "/jobs/j1":
            return httpx.Response(200, json=job_body())
        if request.url.path == "/jobs/j1/timeline":
            return httpx.Response(200, json=timeline_body())
        return httpx.Response(404, json={"ok": False, "code": "not_found", "error": "no job"})

    real = httpx.Client

    def mocked(*args: Any, **kwargs: Any) -> httpx.Client:
        return real(*args, **{**kwargs, "transport": httpx.MockTransport(answer)})

    monkeypatch.setattr(httpx, "Client", mocked)
    env = {"HOPS_GATEWAY_URL": "http://gateway.test"}
    result = CliRunner().invoke(app, ["describe", "alice/j1", "--limit", "5"], env=env)
    assert result.exit_code == 0, result.output
    assert asked == ["/jobs/j1?tenant=alice", "/jobs/j1/timeline?tenant=alice&limit=5"]
    assert "Reason:       Priority" in result.output and "Timeline:" in result.output
    missing = CliRunner().invoke(app, ["describe", "nope"], env=env)
    assert missing.exit_code == 1 and "404 not_found" in missing.output


def test_jobs_show_the_reason_code_and_the_queue_its_forecast() -> None:
    waiting = {**job_body(), "reason": ""}
    ended = {**job_body(), "why": None, "reason": "node lost", "phase": "failed"}
    lines = render_jobs({"jobs": [waiting, ended]}).splitlines()
    assert lines[0].split()[-1] == "reason"
    assert lines[1].split()[-1] == "Priority" and lines[2].split()[-2:] == ["node", "lost"]
    entries = [{"job_id": "j1", "priority": 2.0, "latency_ratio": 1.5, "in_window": True,
                "phase": "queued", "position": 2, "why": {"code": "Priority"},
                "forecast": msgspec.to_builtins(FORECAST)},
               {"job_id": "j2", "priority": 1.0, "latency_ratio": 1.0, "in_window": False,
                "phase": "queued", "reason": "held"}]
    table = render_queue({"leader": "r1", "term": 1, "entries": entries}, now=NOW).splitlines()
    assert table[1].split() == ["#", "job", "priority", "latency", "ratio", "in", "window",
                                "position", "start", "finish", "phase", "reason"]
    assert table[2].split() == ["1", "j1", "2", "1.5", "yes", "2", "in", "12m", "(8m–20m)",
                                "in", "2h00m", "(1h40m–2h30m)", "queued", "Priority"]
    assert table[3].split() == ["2", "j2", "1", "1", "no", "-", "-", "-", "queued", "held"]
