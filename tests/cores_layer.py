"""A layer written outside the scheduler that attaches CPU cores to every
run the policy beneath it assigns: ``per_gpu`` cores per GPU on each of
the assignment's servers (``Configuration.with_extras``), as CODA
allocates cores beside GPUs (docs/design.md, "Resources").

The policy beneath plans GPUs only, so it is shown the running jobs'
configurations without their cores (else it would not recognise a job's
current configuration among its candidates, and move it). The placer and
the executors then book the cores; with ``verify`` the layer checks first
that they fit (:func:`scheduling.check.plan_overallocation`).

The simulator test (tests/test_sim_resources.py) wraps a policy in it
directly; the live test runs this module as the scheduler process
(``python -m tests.cores_layer``): the real scheduler
(:func:`services.scheduler.__main__.main`) with this layer around the
policy ``HOPS_POLICY`` names, attaching ``HOPS_TEST_CORES_PER_GPU`` cores
per GPU."""

from __future__ import annotations

import os
import sys

import msgspec

from scheduling.check import plan_overallocation
from scheduling.layers.base import annotate, without_extras
from scheduling.policy import Policy
from services.scheduler.__main__ import main
from shared.configuration import Configuration
from shared.resources import Resources
from shared.snapshot import LayerRecord, Plan, Snapshot


class CoresPerGpu:
    """Gives every running job ``per_gpu`` CPU cores per GPU on each of its
    servers. The policy beneath plans GPUs only and sees the running jobs'
    GPUs only; with ``verify``, a plan that over-allocates cores is refused
    here, before it reaches the simulator."""

    name = "cores-per-gpu"

    def __init__(self, per_gpu: int, verify: bool = False) -> None:
        self.per_gpu = per_gpu
        self.verify = verify
        self.plans: list[Plan] = []

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan = inner.plan(without_extras(snapshot))
        assignments = tuple(
            msgspec.structs.replace(a, config=self.attach(a.config)) for a in plan.assignments
        )
        plan = annotate(msgspec.structs.replace(plan, assignments=assignments),
                        LayerRecord(self.name, note=f"{self.per_gpu} cores per GPU"))
        if self.verify and (why := plan_overallocation(snapshot, plan)) is not None:
            raise ValueError(f"{self.name}: {why}")
        self.plans.append(plan)
        return plan

    def attach(self, config: Configuration) -> Configuration:
        return config.with_extras({s: Resources(cores=self.per_gpu * g) for s, g in config.parts})



if __name__ == "__main__":
    sys.exit(main(layers=(CoresPerGpu(int(os.environ["HOPS_TEST_CORES_PER_GPU"])),)))
