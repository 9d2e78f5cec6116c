"""A faulty layer written outside the scheduler: the first plan that profiles
a job also places that job on every GPU of the server it profiles on, so the
plan books one GPU twice; later plans are the policy's own.

The live test runs this module as the scheduler process
(``python -m tests.doublebook_layer``): the real scheduler
(:func:`services.scheduler.__main__.main`) with this layer around the policy
that ``HOPS_POLICY`` names, as tests/forbid_layer.py does."""

from __future__ import annotations

import sys

import msgspec

from scheduling.policy import Policy
from services.scheduler.__main__ import main
from shared.configuration import Configuration
from shared.snapshot import Assignment, Plan, Snapshot


class DoubleBook:
    """Double-books a GPU in the first plan with a profiling task."""

    name = "double-book"

    def __init__(self) -> None:
        self.done = False

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan = inner.plan(snapshot)
        if self.done or not plan.profiling:
            return plan
        self.done = True
        task = plan.profiling[0]
        gpus = snapshot.cluster.by_id[task.server].gpus
        whole = Assignment(task.job_id, Configuration(((task.server, gpus),)))
        return msgspec.structs.replace(plan, assignments=(*plan.assignments, whole))


if __name__ == "__main__":
    sys.exit(main(layers=(DoubleBook(),)))
