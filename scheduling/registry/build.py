"""Policies from their specs: :func:`make_policy` (round-based, every one
inside the profiling-first layer) and :func:`make_task_policy` (hare.md's
task-level policies); see :mod:`scheduling.registry`."""

from __future__ import annotations

from typing import assert_never

import msgspec

from scheduling.cells import CellModel
from scheduling.cores.layer import CoreLayer
from scheduling.cores.rules import Coda, Drf, Fifo, FixedCores
from scheduling.cores.settings import CodaSettings
from scheduling.layers.base import LayeredPolicy
from scheduling.layers.hived import HivedLayer
from scheduling.layers.profiling_first import ProfilingFirst, ProfilingSettings
from scheduling.layers.quota import QuotaLayer, quotas_of
from scheduling.policies.gavel.policy import GavelPolicy
from scheduling.policies.hare.baselines import GavelFifo, Homo, Srtf
from scheduling.policies.hare.baselines_allox import Allox
from scheduling.policies.hare.model import TaskPolicy
from scheduling.policies.hare.policy import HarePolicy, HareSettings
from scheduling.policies.hops.policy import HopsPolicy
from scheduling.policies.sia.policy import SiaPolicy
from scheduling.policies.slurm.policy import SlurmPolicy
from scheduling.policies.themis.policy import ThemisPolicy
from scheduling.policies.tiresias.policy import TiresiasPolicy
from scheduling.policy import Policy
from scheduling.registry.grammar import (
    CORE_TYPES,
    TENANT_TYPES,
    CodaSpec,
    CoreSpec,
    DrfCoresSpec,
    FifoCoresSpec,
    FixedCoresSpec,
    HivedSpec,
    PolicySpec,
    QuotaBorrowSpec,
    QuotaSpec,
    TenantSpec,
    core_inner,
    parse_policy,
    parse_task,
    policy_name,
)
from scheduling.registry.specs import (
    AlloxSpec,
    ClusterSettings,
    ClusterSpec,
    ExtensionSpec,
    GavelFifoSpec,
    GavelSpec,
    HareEftSpec,
    HareSpec,
    HomoSpec,
    HopsPaperSpec,
    HopsProfilePreemptSpec,
    HopsSpec,
    PolicyError,
    SiaEstimatorSpec,
    SiaLpStartSpec,
    SiaSpec,
    SlurmSpec,
    SrtfSpec,
    TaskSpec,
    ThemisSpec,
    TiresiasSpec,
)


def make_policy(spec: PolicySpec | str, cells: CellModel | None = None) -> Policy:
    """The policy ``spec`` names, with its settings, inside the
    profiling-first layer. A policy whose traits need the cells
    (``hived``, ``quota``, ``quota-borrow``) is built with the tenants'
    ``cells``; any other ignores them."""
    if isinstance(spec, str):
        spec = parse_policy(spec)
    if isinstance(spec, ExtensionSpec):
        return spec.build(cells)
    if isinstance(spec, TENANT_TYPES):
        return _tenant(spec, cells)
    if isinstance(spec, CORE_TYPES):
        return _cores(spec)
    return _inner(spec).wrapped(ProfilingFirst(profiling_settings(spec)))


def _tenant(spec: TenantSpec, cells: CellModel | None) -> Policy:
    name = policy_name(spec)
    if cells is None:
        raise PolicyError(f"policy {name} needs the tenants' cells (a cells spec: "
                          "cell_types, physical_cells, virtual_clusters)")
    inner = spec.inner_spec
    profiling = profiling_settings(inner)
    match spec:
        case HivedSpec():
            # Profiling inside each virtual cluster: the inner policy runs
            # there as on a private cluster, its profiling queue included.
            hived = HivedLayer(cells, spec.opportunistic, inner.r_num, profiling)
            return _inner(inner).wrapped(ProfilingFirst(profiling), hived)
        case QuotaSpec() | QuotaBorrowSpec():
            layer = QuotaLayer(quotas_of(cells), isinstance(spec, QuotaBorrowSpec), inner.r_num)
            return _inner(inner).wrapped(layer, ProfilingFirst(profiling))
        case _:
            assert_never(spec)


def _cores(spec: CoreSpec) -> Policy:
    inner = core_inner(spec)
    match spec:
        case CodaSpec():
            settings = msgspec.convert(
                {k: v for k, v in msgspec.structs.asdict(spec).items() if k != "inner"},
                CodaSettings)
            layer = CoreLayer(Coda(), settings)
        case FifoCoresSpec():
            layer = CoreLayer(Fifo())
        case DrfCoresSpec():
            layer = CoreLayer(Drf())
        case FixedCoresSpec():
            layer = CoreLayer(FixedCores(spec.per_gpu))
        case _:
            assert_never(spec)
    # Profiling-first outermost: profiling runs hold GPUs only, and CPU jobs
    # are never profiled, so the core layer sees the queue the policy plans.
    return _inner(inner).wrapped(layer, ProfilingFirst(profiling_settings(inner)))


def profiling_settings(spec: ClusterSettings) -> ProfilingSettings:
    """The profiling-first layer's settings in ``spec`` (every policy takes
    the same three, with the same defaults)."""
    return ProfilingSettings(spec.profile_gpus, spec.profile_share, spec.profile_preempt)


def profile_reuse(spec: PolicySpec | str) -> bool:
    """Whether the cluster policy of ``spec`` (inside its tenant or core
    layer) reuses profiles across a signature's jobs (``profile_reuse``;
    a policy defined outside the registry: no)."""
    if isinstance(spec, str):
        spec = parse_policy(spec)
    if isinstance(spec, TENANT_TYPES):
        return spec.inner_spec.profile_reuse
    if isinstance(spec, CORE_TYPES):
        return core_inner(spec).profile_reuse
    if isinstance(spec, ExtensionSpec):
        return False
    return spec.profile_reuse


def _inner(spec: ClusterSpec) -> LayeredPolicy:
    match spec:
        case HopsSpec() | HopsProfilePreemptSpec() | HopsPaperSpec():
            return HopsPolicy(spec)
        case SiaSpec() | SiaLpStartSpec() | SiaEstimatorSpec():
            return SiaPolicy(spec)
        case GavelSpec():
            return GavelPolicy(spec)
        case SlurmSpec():
            return SlurmPolicy(spec)
        case TiresiasSpec():
            return TiresiasPolicy(spec)
        case ThemisSpec():
            return ThemisPolicy(spec)
        case _:
            assert_never(spec)


def make_task_policy(spec: TaskSpec | str) -> TaskPolicy:
    """A fresh task-level policy (:data:`TASK_POLICIES`; Hare's with its
    settings, e.g. ``hare:ties=order``)."""
    if isinstance(spec, str):
        spec = parse_task(spec)
    match spec:
        case HareSpec() | HareEftSpec():
            return HarePolicy(HareSettings(placement=spec.placement, ties=spec.ties))
        case GavelFifoSpec():
            return GavelFifo()
        case SrtfSpec():
            return Srtf()
        case HomoSpec():
            return Homo()
        case AlloxSpec():
            return Allox()
        case _:
            assert_never(spec)
