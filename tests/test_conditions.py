"""A job's conditions (gateway.conditions) and what a viewer sees of its
reason (gateway.explain_view): pure functions of the record and the
leader's hops_explain entry."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.conditions import CONDITION_TYPES, Condition, conditions
from gateway.explain_view import ADMIN, Viewer, explain_fields, list_fields
from shared.explain import ANOTHER_TENANT, JobExplain, JobForecast, Receipt, Why
from shared.ids import JobId
from shared.job import JobSpec
from shared.records import JobRecord

SPEC = JobSpec(id=JobId("alice/j1"), model="resnet50", batch_size=32, params=1,
               total_samples=1000, tenant="alice", requirements=(1, 2))  # type: ignore[arg-type]
PRIORITY = Why(code="Priority", message="higher-priority jobs took the GPUs it needs",
               jobs=(JobId("bob/b1"), JobId("alice/a2")), ratios=(1.5, 1.25), since=40.0)
RECEIPT = Receipt(job_id=JobId("alice/j1"), at=30.0, rule="Fairness",
                  message="the round's first plan gave its GPUs to others",
                  takers=(JobId("bob/b1"),), samples_kept=400.0, total_samples=1000.0)
FORECAST = JobForecast(job_id=JobId("alice/j1"), position=3, tenant_position=1, start=100.0,
                       start_lo=90.0, start_hi=130.0, finish=500.0, finish_lo=450.0,
                       finish_hi=600.0)


def record(phase: str, **kw: Any) -> JobRecord:
    return JobRecord(spec=SPEC, submitted_at=10.0, phase=phase, **kw)  # type: ignore[arg-type]


def explained(**kw: Any) -> JobExplain:
    return JobExplain(job_id=JobId("alice/j1"), at=50.0, **kw)


def by_type(found: list[Condition]) -> dict[str, Condition]:
    assert [c.type for c in found] == list(CONDITION_TYPES)
    return {c.type: c for c in found}


def test_a_waiting_job_is_not_scheduled_for_its_plans_reason() -> None:
    c = by_type(conditions(record("queued", profiled=("A100",)), explained(why=PRIORITY)))
    assert (c["Submitted"].status, c["Submitted"].since) == ("True", 10.0)
    assert (c["Profiled"].status, c["Profiled"].message) == ("True", "profiled on A100")
    assert (c["Scheduled"].status, c["Scheduled"].reason, c["Scheduled"].since) == (
        "False", "Priority", 40.0)
    assert c["Scheduled"].message == ("higher-priority jobs took the GPUs it needs: bob/b1 "
                                      "(latency ratio 1.5), alice/a2 (latency ratio 1.25)")
    assert (c["Running"].status, c["Running"].reason) == ("False", "Waiting")
    assert (c["Preempted"].status, c["Finished"].status, c["Failed"].status) == (
        "False", "False", "False")


def test_profiling_and_an_unknown_profile() -> None:
    why = Why(code="Profiling", message="profiling on V100", types=("V100",))  # type: ignore[arg-type]
    c = by_type(conditions(record("profiling"), explained(why=why)))
    assert (c["Profiled"].status, c["Profiled"].reason, c["Profiled"].since) == (
        "False", "Profiling", 50.0)
    assert c["Scheduled"].reason == "Profiling"
    fresh = by_type(conditions(record("submitted"), None))
    assert (fresh["Profiled"].status, fresh["Scheduled"].reason) == ("Unknown", "Pending")
    held = by_type(conditions(record("queued", held=True, reason="held: maintenance"), None))
    assert (held["Scheduled"].reason, held["Scheduled"].message) == ("Held", "held: maintenance")


def test_a_stopped_job_is_preempted_until_it_runs_again() -> None:
    stopped = by_type(conditions(record("queued", first_start=20.0, restarts=1),
                                 explained(why=PRIORITY, receipt=RECEIPT)))
    assert (stopped["Preempted"].status, stopped["Preempted"].reason,
            stopped["Preempted"].since) == ("True", "Fairness", 30.0)
    assert stopped["Preempted"].message.endswith("; its GPUs went to bob/b1")
    assert (stopped["Running"].reason, stopped["Running"].since) == ("Stopped", 30.0)
    again = by_type(conditions(record("running", first_start=20.0, restarts=1),
                               explained(receipt=RECEIPT, forecast=FORECAST)))
    assert (again["Preempted"].status, again["Preempted"].reason) == ("False", "Resumed")
    # a running job's forecast start is when it (last) started
    assert (again["Running"].status, again["Running"].since) == ("True", 100.0)
    assert (again["Scheduled"].status, again["Scheduled"].since) == ("True", 100.0)


def test_ended_jobs() -> None:
    done = by_type(conditions(record("finished", first_start=20.0, finished_at=90.0), None))
    assert (done["Finished"].status, done["Finished"].since, done["Failed"].status) == (
        "True", 90.0, "False")
    assert (done["Running"].status, done["Running"].reason) == ("False", "Finished")
    failed = by_type(conditions(record("failed", first_start=20.0, finished_at=90.0,
                                       reason="node lost"), None))
    assert (failed["Failed"].status, failed["Failed"].message) == ("True", "node lost")
    cancelled = by_type(conditions(record("cancelled", finished_at=15.0), None))
    assert [cancelled[t].reason for t in ("Scheduled", "Finished", "Failed")] == [
        "Cancelled", "Cancelled", "Cancelled"]
    assert cancelled["Scheduled"].status == "False"


def test_a_tenant_sees_another_tenants_job_as_such_in_every_field() -> None:
    explain = explained(why=PRIORITY, receipt=RECEIPT, forecast=FORECAST,
                        estimated_throughput=120.0, measured_throughput=100.0)
    alice = Viewer(tenant="alice")
    body = explain_fields(record("queued", first_start=20.0), explain, alice)
    text = msgspec.json.encode(body).decode()
    assert "b1" not in text and "bob" not in text and "alice/" not in text
    assert body["why"]["details"]["jobs"] == [ANOTHER_TENANT, "a2"]
    assert body["why"]["message"] == ("higher-priority jobs took the GPUs it needs: "
                                      f"{ANOTHER_TENANT}, a2 (latency ratio 1.25)")
    assert body["receipt"]["takers"] == [ANOTHER_TENANT] and body["receipt"]["job_id"] == "j1"
    assert body["receipt"]["message"].endswith(f"its GPUs went to {ANOTHER_TENANT}")
    assert body["forecast"]["position"] == 3 and "job_id" not in body["forecast"]
    assert body["throughput"] == {"estimated": 120.0, "measured": 100.0}
    scheduled = next(c for c in body["conditions"] if c["type"] == "Scheduled")
    assert scheduled["message"] == body["why"]["message"]
    admin = explain_fields(record("queued"), explain, ADMIN)
    assert admin["why"]["details"]["jobs"] == ["bob/b1", "alice/a2"]
    assert "bob/b1 (latency ratio 1.5)" in admin["why"]["message"]
    # a bare key of another tenant (written before keys were qualified)
    legacy = Viewer(tenant="default", tenants={"b1": "bob"})
    assert legacy.name("b1") == ANOTHER_TENANT and legacy.name("j9") == "j9"
    assert list_fields(explain, alice)["why"]["details"]["jobs"] == [ANOTHER_TENANT, "a2"]
    assert list_fields(explained(), alice) == {"why": None}
