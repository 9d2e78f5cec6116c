"""A policy defined outside the registry, whose layer claims the trait
``schedules_cores`` (docs/design.md, "Policy layers"): registered here
(:func:`scheduling.registry.register`), it runs wherever a spec names it.

The tests register it for their own process; the live test runs this module
as the scheduler process (``python -m tests.traits_policy``), which is the
real scheduler (:func:`services.scheduler.__main__.main`) with this policy
registered, named by ``HOPS_POLICY=test-cores``: the mechanism admits and
plans CPU jobs because the policy's traits say so, not because it knows
the name."""

from __future__ import annotations

import sys

from scheduling.cells import CellModel
from scheduling.cores.layer import CoreLayer
from scheduling.cores.rules import Fifo
from scheduling.layers.profiling_first import ProfilingFirst
from scheduling.layers.traits import PolicyTraits
from scheduling.policies.hops.policy import HopsPolicy
from scheduling.policy import Policy
from scheduling.registry import ExtensionSpec, HopsSpec, profiling_settings, register
from shared.snapshot import Plan, Snapshot

NAME = "test-cores"


class FifoCores:
    """CPU jobs first come first served beside the GPU jobs (the FIFO core
    rule), as a layer of its own: its traits are its own, not the core
    layer's."""

    name = NAME

    def __init__(self) -> None:
        self.cores = CoreLayer(Fifo())

    @classmethod
    def traits(cls) -> PolicyTraits:
        return PolicyTraits(schedules_cores=True)

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        return self.cores.plan(snapshot, inner)


class FifoCoresSpec(ExtensionSpec, tag=NAME, tag_field="name", frozen=True):
    """``test-cores``: Hops inside the :class:`FifoCores` layer, inside the
    profiling-first layer (as the registry's core policies)."""

    def build(self, cells: CellModel | None) -> Policy:
        hops = HopsSpec()
        return HopsPolicy(hops).wrapped(FifoCores(), ProfilingFirst(profiling_settings(hops)))

    def layer_traits(self) -> tuple[PolicyTraits, ...]:
        return (FifoCores.traits(),)


if __name__ == "__main__":
    from services.scheduler.__main__ import main

    register(FifoCoresSpec)
    sys.exit(main())
