"""What the mechanism asks of a policy spec, answered by the layer classes
of the stack it names (:mod:`scheduling.layers.traits`), from the spec
alone: admission decides from them whether to load the tenants' cells, so
they are known before any cells exist."""

from __future__ import annotations

from typing import assert_never

from scheduling.cores.layer import CoreLayer
from scheduling.layers.hived import HivedLayer
from scheduling.layers.quota import QuotaLayer
from scheduling.layers.traits import PolicyTraits, TenantAdmission, combine
from scheduling.registry.grammar import (
    CORE_TYPES,
    AnySpec,
    HivedSpec,
    PolicySpec,
    QuotaBorrowSpec,
    QuotaSpec,
    parse_any,
    parse_policy,
    policy_name,
)
from scheduling.registry.specs import (
    CLUSTER_TYPES,
    TASK_TYPES,
    ExtensionSpec,
)


def policy_traits(spec: PolicySpec | str) -> PolicyTraits:
    """The traits of the policy ``spec`` names: its layers', composed (the
    profiling-first layer and the cluster policies add none)."""
    if isinstance(spec, str):
        spec = parse_policy(spec)
    return combine(policy_name(spec), *_layer_traits(spec))


def any_traits(spec: AnySpec | str) -> PolicyTraits:
    """The traits of any spec, a task-level one's included: those sequence
    tasks (:attr:`PolicyTraits.sequences_tasks`) and have no layers."""
    if isinstance(spec, str):
        spec = parse_any(spec)
    if isinstance(spec, TASK_TYPES):
        return PolicyTraits(policy=str(spec.__struct_config__.tag), sequences_tasks=True)
    return policy_traits(spec)


def _layer_traits(spec: PolicySpec) -> tuple[PolicyTraits, ...]:
    if isinstance(spec, ExtensionSpec):
        return spec.layer_traits()
    if isinstance(spec, CLUSTER_TYPES):
        return ()
    if isinstance(spec, CORE_TYPES):
        return (CoreLayer.traits(),)
    match spec:
        case HivedSpec():
            return (HivedLayer.traits(spec.opportunistic),)
        case QuotaSpec() | QuotaBorrowSpec():
            return (QuotaLayer.traits(isinstance(spec, QuotaBorrowSpec)),)
        case _:
            assert_never(spec)


def tenant_admission(spec: PolicySpec) -> TenantAdmission:
    """The admission rule of a policy spec (a policy without cells: no limit)."""
    return policy_traits(spec).admission


def schedules_cores(spec: PolicySpec) -> bool:
    """Whether ``spec`` schedules CPU cores (a core layer around its inner
    policy), hence may take CPU jobs."""
    return policy_traits(spec).schedules_cores
