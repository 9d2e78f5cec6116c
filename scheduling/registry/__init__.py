"""Policies by name: one registry for the CLI, the simulator and the live
scheduler (pure: no I/O).

A policy is named by a *spec*: its name plus typed settings. Each spec is a
msgspec struct tagged with the policy's name that extends the policy's own
settings (:class:`~scheduling.policies.hops.policy.HopsSettings`,
:class:`~scheduling.policies.sia.policy.SiaSettings`,
:class:`~scheduling.policies.gavel.policy.GavelSettings`, and the Slurm-style,
Tiresias and Themis baselines' ``SlurmSettings``, ``TiresiasSettings``,
``ThemisSettings``), so every setting keeps the one
definition and default of its policy, and a spec is itself the settings its
policy is built with. Variants (``hops-profile-preempt``, ``sia-lp-start``)
are specs whose defaults differ in one field.

Text form, the same at every entry point (``--policy``, ``HOPS_POLICY``)::

    hops
    sia:lam=1.2
    hops:sigma=1.6,priority=ftf

or a JSON mapping, ``{"name": "sia", "lam": 1.2}``. A name the registry does
not know, or a setting the policy does not take, is an error that names it:
``lam`` is Eq. (11)'s exponent for Hops and Gavel but Sia's no-allocation
penalty, and nothing is silently dropped.

The mechanism (simulator, leader) receives the policy object built by
:func:`make_policy` and never looks at its name: what it needs to know
(whether the policy is built with the tenants' cells, schedules CPU cores,
its tenant admission rule, its tenants' views) it asks
:func:`policy_traits`, which the layers of the spec's stack answer. Every policy comes wrapped
in the profiling-first layer (Hops §3.2,
:class:`~.layers.profiling_first.ProfilingFirst`) with the spec's
``profile_*`` settings: no policy profiles on its own.

Tenant policies (issue 20) wrap a cluster policy, named by their ``inner``
setting, in a tenant layer: ``hived`` (HiveD's virtual clusters,
:class:`~.layers.hived.HivedLayer`; ``opportunistic``), ``quota`` and
``quota-borrow`` (Kueue-style nominal quota,
:class:`~.layers.quota.QuotaLayer`). They need the tenants' cells
(``make_policy(spec, cells=model)``). In the text form ``inner`` comes last
and takes the rest of the text, so the inner spec keeps its commas::

    hived:opportunistic=false,inner=hops:lam=inf,sigma=1.6

The profiling-first layer goes around the whole stack, once, with the inner
spec's ``profile_*`` settings; the inner spec is a cluster policy (a tenant
policy inside another is an error).

Task-level policies (issue 23, hare.md) decide a sequence of tasks per GPU
for relaxed-synchronisation jobs, not a configuration per round, so they
answer :class:`~.policies.hare.model.TaskPolicy` instead; they are named
here too, in the same grammar (``hare:ties=order``, :func:`parse_task`,
:data:`TASK_POLICIES`, :func:`make_task_policy`), and a round-based entry
point given one of their names says so. :func:`parse_any` parses a spec of
either kind; :func:`spec_name` reads a spec's name without its settings.

A policy defined outside the registry subclasses :class:`ExtensionSpec`
and is added with :func:`register`.

The package: :mod:`.specs` (the spec types of one policy each, and the
names), :mod:`.grammar` (text and JSON, both ways, with the tenant and core
specs, whose ``inner`` is text in it), :mod:`.build` (the policies),
:mod:`.traits` (what the mechanism asks).
"""
from scheduling.layers.traits import PolicyTraits, TenantAdmission
from scheduling.registry.build import (
    make_policy,
    make_task_policy,
    profile_reuse,
    profiling_settings,
)
from scheduling.registry.grammar import (
    CORE_TYPES,
    SPECS,
    TENANT_TYPES,
    AnySpec,
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
    check,
    core_inner,
    parse_any,
    parse_policy,
    parse_task,
    policy_name,
    register,
    resolve,
    settings_of,
    spec_from_mapping,
    spec_name,
    spec_text,
    with_settings,
)
from scheduling.registry.specs import (
    CLUSTER_TYPES,
    CORE_POLICIES,
    DEFAULT_INNER,
    DEFAULT_POLICY,
    POLICIES,
    TASK_POLICIES,
    TASK_SPECS,
    TASK_TYPES,
    TENANT_POLICIES,
    AlloxSpec,
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
from scheduling.registry.traits import (
    any_traits,
    policy_traits,
    schedules_cores,
    tenant_admission,
)

__all__ = [
    "CLUSTER_TYPES",
    "CORE_POLICIES",
    "CORE_TYPES",
    "DEFAULT_INNER",
    "DEFAULT_POLICY",
    "POLICIES",
    "SPECS",
    "TASK_POLICIES",
    "TASK_SPECS",
    "TASK_TYPES",
    "TENANT_POLICIES",
    "TENANT_TYPES",
    "AlloxSpec",
    "AnySpec",
    "ClusterSpec",
    "CodaSpec",
    "CoreSpec",
    "DrfCoresSpec",
    "ExtensionSpec",
    "FifoCoresSpec",
    "FixedCoresSpec",
    "GavelFifoSpec",
    "GavelSpec",
    "HareEftSpec",
    "HareSpec",
    "HivedSpec",
    "HomoSpec",
    "HopsPaperSpec",
    "HopsProfilePreemptSpec",
    "HopsSpec",
    "PolicyError",
    "PolicySpec",
    "PolicyTraits",
    "QuotaBorrowSpec",
    "QuotaSpec",
    "SiaEstimatorSpec",
    "SiaLpStartSpec",
    "SiaSpec",
    "SlurmSpec",
    "SrtfSpec",
    "TaskSpec",
    "TenantAdmission",
    "TenantSpec",
    "ThemisSpec",
    "TiresiasSpec",
    "any_traits",
    "check",
    "core_inner",
    "make_policy",
    "make_task_policy",
    "parse_any",
    "parse_policy",
    "parse_task",
    "policy_name",
    "policy_traits",
    "profile_reuse",
    "profiling_settings",
    "register",
    "resolve",
    "schedules_cores",
    "settings_of",
    "spec_from_mapping",
    "spec_name",
    "spec_text",
    "tenant_admission",
    "with_settings",
]
