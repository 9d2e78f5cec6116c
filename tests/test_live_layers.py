"""A layer written in a test, unchanged in the live scheduler: the real
scheduler process, launched by tests/forbid_layer.py with that layer around
the policy ``HOPS_POLICY`` names, never profiles or places a job on the
forbidden server (docs/design.md, "Policy layers")."""

from __future__ import annotations

import pytest

from scheduling.policies.sia.bootstrap import STATE as SIA_STATE
from shared.configuration import Configuration
from shared.ids import JobId
from tests.test_live_scheduler import (
    Bus,
    Stack,
    bus,
    job,
    nats_server,
    nats_url,
    profile_as_planned,
    profiled_in,
    stack,
)

__all__ = ["bus", "nats_server", "nats_url", "stack"]  # fixtures


@pytest.mark.parametrize("policy", ["hops", "sia"])
async def test_a_test_layer_runs_in_the_live_scheduler(
    stack: Stack, bus: Bus, policy: str
) -> None:
    await stack.start("services.estimator")
    await stack.start("services.profiler")
    # Sia plans only at a round's start: short rounds, so that one comes soon.
    scheduler = await stack.start(
        "tests.forbid_layer", HOPS_TEST_FORBID="a0", HOPS_POLICY=policy, HOPS_ROUND_S="3"
    )
    await scheduler.wait_log("elected leader")
    assert (await bus.submit(job("j1", (4,)))).ok
    await bus.put_nodes()  # a0 and a1 (4 GPUs of A each), b0 (2 of B)
    plan = await bus.wait_plan(lambda p: profiled_in(p, "j1") == {"A", "B"})
    assert {t.server for t in plan.plan.profiling} == {"a1", "b0"}
    await bus.wait_phase("j1", "profiling")
    await profile_as_planned(bus, plan, "j1")
    await bus.sample("j1", "a1", "A", 190.0)
    assigned = await bus.wait_plan(lambda p: p.plan.config_of(JobId("j1")) is not None)
    # Four GPUs of one type: only a1 is left to the policy (b0 has two).
    assert assigned.plan.config_of(JobId("j1")) == Configuration.of({"a1": 4})
    # outermost first, then a policy's own state (Sia's measurements)
    own = [SIA_STATE] if policy == "sia" else []
    assert [r.name for r in assigned.plan.reasons.layers] == [
        "forbid-server", "profiling-first", *own]
    assert assigned.plan.reasons.policy == policy
    for p in bus.plans:
        used = {t.server for t in p.plan.profiling}
        used |= {sid for a in p.plan.assignments for sid in a.config.servers}
        assert "a0" not in used
