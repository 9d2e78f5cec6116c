"""A layer written outside the scheduler: it forbids one server to the
policy beneath it (docs/design.md, "Policy layers").

The simulator test wraps a policy in it directly; the live test runs this
module as the scheduler process (``python -m tests.forbid_layer``), which
is the real scheduler (:func:`services.scheduler.__main__.main`) with this
layer around the policy that ``HOPS_POLICY`` names, forbidding the server
named by ``HOPS_TEST_FORBID``."""

from __future__ import annotations

import os
import sys

from scheduling.layers.base import annotate, hold_servers
from scheduling.policy import Policy
from services.scheduler.__main__ import main
from shared.ids import ServerId
from shared.snapshot import LayerRecord, Plan, Snapshot


class ForbidServer:
    """Holds every GPU of one server, so the policy beneath never uses it."""

    name = "forbid-server"

    def __init__(self, server: ServerId) -> None:
        self.server = server
        self.plans: list[Plan] = []  # what it returned, for the simulator test

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        view = hold_servers(snapshot, {self.server})
        plan = inner.plan(view)
        held = {k: v - snapshot.held.get(k, 0) for k, v in view.held.items()}
        record = LayerRecord(self.name, held={k: v for k, v in held.items() if v}, note=self.server)
        plan = annotate(plan, record)
        self.plans.append(plan)
        return plan


if __name__ == "__main__":
    sys.exit(main(layers=(ForbidServer(ServerId(os.environ["HOPS_TEST_FORBID"])),)))
