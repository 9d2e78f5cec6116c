"""A layer written outside the scheduler that attaches CPU cores to every
run the policy beneath it assigns: ``cores_per_gpu`` cores per GPU on each
of the assignment's servers (``Configuration.with_extras``), as CODA
allocates cores beside GPUs (docs/design.md, "Resources").

The policy beneath plans GPUs only, so it is shown the running jobs'
configurations without their cores (else it would not recognise a job's
current configuration among its candidates, and move it). The placer and
the executors then book the cores; nothing here checks that they fit.

The live test runs this module as the scheduler process (``python -m
tests.cores_layer``): the real scheduler
(:func:`services.scheduler.__main__.main`) with this layer around the
policy ``HOPS_POLICY`` names, attaching ``HOPS_TEST_CORES_PER_GPU`` cores
per GPU."""

from __future__ import annotations

import os
import sys

import msgspec

from scheduling.layers.base import annotate
from scheduling.policy import Policy
from services.scheduler.__main__ import main
from shared.resources import Resources
from shared.snapshot import Assignment, LayerRecord, Plan, Snapshot


def gpus_only(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with running jobs' configurations without their extras."""
    jobs = tuple(msgspec.structs.replace(j, current=j.current.gpus_only)
                 if j.current is not None and j.current.extras else j for j in snapshot.jobs)
    return msgspec.structs.replace(snapshot, jobs=jobs)


class CoresPerGpu:
    """Attaches ``cores_per_gpu`` CPU cores per GPU to every assignment."""

    name = "cores-per-gpu"

    def __init__(self, cores_per_gpu: int) -> None:
        self.cores_per_gpu = cores_per_gpu

    def with_cores(self, a: Assignment) -> Assignment:
        extras = {s: Resources(cores=g * self.cores_per_gpu) for s, g in a.config.parts}
        return msgspec.structs.replace(a, config=a.config.with_extras(extras))

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan = inner.plan(gpus_only(snapshot))
        plan = msgspec.structs.replace(
            plan, assignments=tuple(self.with_cores(a) for a in plan.assignments))
        return annotate(plan, LayerRecord(self.name, note=f"{self.cores_per_gpu} per GPU"))


if __name__ == "__main__":
    sys.exit(main(layers=(CoresPerGpu(int(os.environ["HOPS_TEST_CORES_PER_GPU"])),)))
