"""The leader checks every plan as the simulator does
(:func:`scheduling.check.plan_overallocation`): the real scheduler process,
launched by tests/doublebook_layer.py with a layer that double-books a GPU
in its first plan, refuses that plan (logged with the reason, counted, never
published) and keeps planning: the next plan is published."""

from __future__ import annotations

from shared.events import ErrorRecord
from shared.ids import JobId
from tests.test_live_scheduler import (
    Bus,
    Stack,
    bus,
    eventually,
    job,
    nats_server,
    nats_url,
    profiled_in,
    stack,
)

__all__ = ["bus", "nats_server", "nats_url", "stack"]  # fixtures


async def test_the_leader_refuses_an_over_allocating_plan_and_plans_again(
    stack: Stack, bus: Bus
) -> None:
    scheduler = await stack.start("tests.doublebook_layer", HOPS_POLICY="hops", HOPS_ROUND_S="3")
    await scheduler.wait_log("elected leader")
    assert (await bus.submit(job("j1", (4,)))).ok
    await bus.put_nodes()  # a0 and a1 (4 GPUs of A each), b0 (2 of B)
    refused = await scheduler.wait_log("plan refused")
    assert refused["plans_refused"] == 1
    assert "GPUs free of" in refused["reason"], refused
    # the error record is published after the log line: wait for it to arrive
    async def refusal_record() -> ErrorRecord | None:
        return next((e for e in bus.errors if e.subject == "scheduler.plan"), None)

    record = await eventually(refusal_record, what="the plan_refused error record")
    assert record.service == "scheduler" and record.error == f"plan refused: {refused['reason']}"
    assert record.code == "plan_refused"
    # the next plan is the policy's own, and published
    plan = await bus.wait_plan(lambda p: profiled_in(p, "j1") == {"A", "B"})
    assert plan.term == refused["term"]
    # the double-booking plan never was: no published plan places j1
    assert all(p.plan.config_of(JobId("j1")) is None for p in bus.plans)
    assert len(scheduler.lines_with("plan refused")) == 1
