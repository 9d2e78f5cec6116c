"""Policies by name: one registry for the CLI, the simulator and the live
scheduler (pure: no I/O).

A policy is named by a *spec*: its name plus typed settings. Each spec is a
msgspec struct tagged with the policy's name that extends the policy's own
settings (:class:`~.planner.HopsSettings`, :class:`~.baselines.sia.SiaSettings`,
:class:`~.baselines.gavel.GavelSettings`), so every setting keeps the one
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
:func:`make_policy` and never looks at its name. Every policy comes wrapped
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
here too (:data:`TASK_POLICIES`, :func:`make_task_policy`), and a
round-based entry point given one of their names says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import assert_never

import msgspec

from scheduling.cells import CellModel
from scheduling.cores.layer import CodaSettings, CoreLayer
from scheduling.cores.rules import Coda, Drf, Fifo, FixedCores
from scheduling.layers.base import LayeredPolicy
from scheduling.layers.hived import HivedLayer
from scheduling.layers.profiling_first import ProfilingFirst, ProfilingSettings
from scheduling.layers.quota import QuotaLayer, quotas_of
from scheduling.policies.gavel.policy import GavelPolicy, GavelSettings
from scheduling.policies.hare.model import TaskPolicy
from scheduling.policies.hare.names import TASK_POLICIES, task_policy
from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.policies.sia.policy import SiaPolicy, SiaSettings
from scheduling.policy import Policy
from scheduling.priorities import priority_fn

DEFAULT_INNER = "hops"


class HopsSpec(HopsSettings, tag="hops", tag_field="name", frozen=True):
    """The paper's scheduler (:class:`~.planner.HopsPolicy`)."""


class HopsProfilePreemptSpec(
    HopsSettings, tag="hops-profile-preempt", tag_field="name", frozen=True
):
    """Hops whose profiling may take a running job's GPU at a round boundary
    (the paper's profiling-first, §3.2; ``HopsSettings.profile_preempt``)."""

    profile_preempt: bool = True


class HopsPaperSpec(HopsSettings, tag="hops-paper", tag_field="name", frozen=True):
    """Hops as the paper states it: no reconfiguration cost, every running
    job replanned at a first plan, the fill plans' window over every waiting
    job, and every pass proven to the 1% gap of §4.7 (docs/baselines.md,
    "Hops variants")."""

    reconfig_cost: float | None = 0.0
    fill_filter: bool = False
    accept_gap: float = 0.01
    preempt_exempt: float = 0.0


class SiaSpec(SiaSettings, tag="sia", tag_field="name", frozen=True):
    """The Sia baseline (:class:`~.baselines.sia.SiaPolicy`)."""


class SiaLpStartSpec(SiaSettings, tag="sia-lp-start", tag_field="name", frozen=True):
    """Sia with the LP optimum rounded down as its ILP's start
    (``SiaSettings.start``), for comparing solve times."""

    start: str = "rounded-lp"


class SiaEstimatorSpec(SiaSettings, tag="sia-estimator", tag_field="name", frozen=True):
    """Sia given Hops' estimator's curves instead of its own bootstrapped
    model (``SiaSettings.throughput``): better information than its paper's."""

    throughput: str = "estimator"


class GavelSpec(GavelSettings, tag="gavel", tag_field="name", frozen=True):
    """The Gavel baseline (:class:`~.baselines.gavel.GavelPolicy`)."""


ClusterSpec = (HopsSpec | HopsProfilePreemptSpec | HopsPaperSpec | SiaSpec | SiaLpStartSpec
               | SiaEstimatorSpec | GavelSpec)
CLUSTER_TYPES = (HopsSpec, HopsProfilePreemptSpec, HopsPaperSpec, SiaSpec, SiaLpStartSpec,
                 SiaEstimatorSpec, GavelSpec)


class _TenantSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tenant layer around the cluster policy ``inner`` (its spec text)."""

    inner: str = DEFAULT_INNER

    @property
    def inner_spec(self) -> ClusterSpec:
        spec = parse_policy(self.inner)
        if not isinstance(spec, CLUSTER_TYPES):
            kind = "tenant" if isinstance(spec, TENANT_TYPES) else "core"
            raise PolicyError(f"inner policy {self.inner!r} is a {kind} policy; "
                              "it must be a cluster policy")
        return spec

    @property
    def r_num(self) -> int:
        """The inner policy's R_num (what admission and the mechanism read)."""
        return self.inner_spec.r_num


class HivedSpec(_TenantSpec, tag="hived", tag_field="name", frozen=True):
    """HiveD's virtual clusters around ``inner`` (:class:`~.layers.hived.HivedLayer`);
    ``opportunistic``: jobs beyond their tenant's cells may use idle GPUs."""

    opportunistic: bool = True


class QuotaSpec(_TenantSpec, tag="quota", tag_field="name", frozen=True):
    """Kueue-style nominal quota per tenant and GPU type, no borrowing."""


class QuotaBorrowSpec(_TenantSpec, tag="quota-borrow", tag_field="name", frozen=True):
    """Nominal quota with borrowing of other tenants' idle quota."""


TenantSpec = HivedSpec | QuotaSpec | QuotaBorrowSpec
TENANT_TYPES = (HivedSpec, QuotaSpec, QuotaBorrowSpec)


class CodaSpec(CodaSettings, tag="coda", tag_field="name", frozen=True):
    """CODA (docs/coda.md): adaptive cores per GPU job, CPU jobs in their own
    array beside the GPU jobs' reserved cores, around the cluster policy
    ``inner`` (:class:`~.cores.layer.CoreLayer`)."""

    inner: str = DEFAULT_INNER

    @property
    def r_num(self) -> int:
        return core_inner(self).r_num


class FifoCoresSpec(msgspec.Struct, tag="fifo", tag_field="name", frozen=True,
                    forbid_unknown_fields=True):
    """Cores as requested, CPU jobs first come first served, around ``inner``."""

    inner: str = DEFAULT_INNER

    @property
    def r_num(self) -> int:
        return core_inner(self).r_num


class DrfCoresSpec(msgspec.Struct, tag="drf", tag_field="name", frozen=True,
                   forbid_unknown_fields=True):
    """Cores as requested, CPU jobs by their tenants' dominant share."""

    inner: str = DEFAULT_INNER

    @property
    def r_num(self) -> int:
        return core_inner(self).r_num


class FixedCoresSpec(msgspec.Struct, tag="fixed-cores", tag_field="name", frozen=True,
                     forbid_unknown_fields=True):
    """Slurm's ``--cpus-per-gpu``: ``per_gpu`` cores per GPU for every GPU
    job (0: each server's cores over its GPUs, rounded down)."""

    per_gpu: int = 0
    inner: str = DEFAULT_INNER

    @property
    def r_num(self) -> int:
        return core_inner(self).r_num


CoreSpec = CodaSpec | FifoCoresSpec | DrfCoresSpec | FixedCoresSpec
CORE_TYPES = (CodaSpec, FifoCoresSpec, DrfCoresSpec, FixedCoresSpec)
PolicySpec = ClusterSpec | TenantSpec | CoreSpec

SPECS: Mapping[str, type[PolicySpec]] = {
    str(cls.__struct_config__.tag): cls
    for cls in (*CLUSTER_TYPES, *TENANT_TYPES, *CORE_TYPES)
}
# The cluster policies (every one runs without tenants' cells); the tenant
# policies need cells.
POLICIES: tuple[str, ...] = ("hops", "hops-profile-preempt", "hops-paper", "sia",
                             "sia-lp-start", "sia-estimator", "gavel")
TENANT_POLICIES: tuple[str, ...] = ("hived", "quota", "quota-borrow")
# The core policies: CPU cores scheduled beside the GPUs (issue 21).
CORE_POLICIES: tuple[str, ...] = ("coda", "fifo", "drf", "fixed-cores")
DEFAULT_POLICY = "hops"


class PolicyError(ValueError):
    """A spec that names no policy, or a setting its policy does not take."""


def settings_of(name: str) -> tuple[str, ...]:
    """The settings policy ``name`` takes."""
    return tuple(f.name for f in msgspec.structs.fields(_spec_type(name)))


def parse_policy(text: str) -> PolicySpec:
    """A spec from its text form (see the module docstring)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            mapping = msgspec.json.decode(text)
        except msgspec.DecodeError as e:
            raise PolicyError(f"policy {text!r}: {e}") from None
        if not isinstance(mapping, dict):
            raise PolicyError(f"policy {text!r}: expected a mapping")
        return spec_from_mapping(mapping)
    name, _, rest = text.partition(":")
    values: dict[str, object] = {}
    rest, inner = _split_inner(rest)
    if inner is not None:
        values["inner"] = inner
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise PolicyError(f"policy {text!r}: {item!r} is not SETTING=VALUE")
        values[key.strip()] = value.strip()
    return spec_from_mapping({"name": name.strip(), **values})


def spec_from_mapping(mapping: Mapping[str, object]) -> PolicySpec:
    """A spec from ``{"name": ..., setting: value, ...}``; values may be
    text (``"1.2"``, ``"true"``, ``"inf"``), converted to each setting's type."""
    values = dict(mapping)
    name = values.pop("name", None)
    if not isinstance(name, str):
        raise PolicyError(f"a policy spec needs a name; known: {', '.join(POLICIES)}")
    return with_settings(_spec_type(name)(), values)


def with_settings(spec: PolicySpec, values: Mapping[str, object]) -> PolicySpec:
    """``spec`` with ``values`` set; a setting its policy does not take is an
    error (e.g. ``sigma`` for Sia), never ignored."""
    name = policy_name(spec)
    known = settings_of(name)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise PolicyError(
            f"policy {name} takes no setting {', '.join(unknown)}; it takes: {', '.join(known)}"
        )
    fields = {**msgspec.structs.asdict(spec), **values, "name": name}
    try:
        new: PolicySpec = msgspec.convert(fields, type=PolicySpec, strict=False)
    except msgspec.ValidationError as e:
        raise PolicyError(f"policy {name}: {e}") from None
    check(new)
    return new


def _split_inner(rest: str) -> tuple[str, str | None]:
    """``rest`` without a trailing ``inner=...``, and that inner spec text."""
    for i, item in enumerate(rest.split(",")):
        if item.strip().startswith("inner="):
            head = ",".join(rest.split(",")[:i])
            tail = ",".join(rest.split(",")[i:]).strip()
            return head, tail.partition("=")[2].strip()
    return rest, None


def check(spec: PolicySpec) -> None:
    """Errors that only building the policy would find (the priority's name,
    a tenant policy's inner spec)."""
    if isinstance(spec, TENANT_TYPES):
        try:
            _ = spec.inner_spec
        except PolicyError as e:
            raise PolicyError(f"policy {policy_name(spec)}: inner: {e}") from None
        return
    if isinstance(spec, CORE_TYPES):
        try:
            core_inner(spec)
        except PolicyError as e:
            raise PolicyError(f"policy {policy_name(spec)}: inner: {e}") from None
        return
    try:
        priority_fn(spec.priority)
    except ValueError as e:
        raise PolicyError(f"policy {policy_name(spec)}: {e}") from None


def policy_name(spec: PolicySpec) -> str:
    return str(spec.__struct_config__.tag)


def spec_text(spec: PolicySpec) -> str:
    """The text form of ``spec``: its name and the settings that differ from
    the named policy's defaults (``parse_policy(spec_text(s)) == s``)."""
    name = policy_name(spec)
    base = msgspec.structs.asdict(SPECS[name]())
    items = msgspec.structs.asdict(spec).items()
    changed = [f"{k}={_text(v)}" for k, v in items if base[k] != v and k != "inner"]
    inner = getattr(spec, "inner", DEFAULT_INNER)
    changed += [f"inner={inner}"] if inner != DEFAULT_INNER else []  # last: it takes the rest
    return name + (":" + ",".join(changed) if changed else "")


def make_policy(spec: PolicySpec | str, cells: CellModel | None = None) -> Policy:
    """The policy ``spec`` names, with its settings, inside the
    profiling-first layer. A tenant policy (``hived``, ``quota``,
    ``quota-borrow``) needs the tenants' ``cells``; a cluster policy
    ignores them."""
    if isinstance(spec, str):
        spec = parse_policy(spec)
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


def core_inner(spec: CoreSpec) -> ClusterSpec:
    """The cluster policy a core policy wraps (its ``inner`` text)."""
    inner = parse_policy(spec.inner)
    if not isinstance(inner, CLUSTER_TYPES):
        raise PolicyError(f"inner policy {spec.inner!r} must be a cluster policy "
                          f"({', '.join(POLICIES)})")
    return inner


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


class TenantAdmission(msgspec.Struct, frozen=True):
    """What a policy lets a tenant's job do beyond the tenant's reservation,
    for admission (a job that can never run is refused): ``beyond``, run
    there at all (HiveD's opportunistic jobs, Kueue's borrowing); ``quota``,
    the reservation counts GPUs per type (Kueue's nominal quota) rather
    than cells (HiveD)."""

    beyond: bool = True
    quota: bool = False


def tenant_admission(spec: PolicySpec) -> TenantAdmission:
    """The admission rule of a policy spec (a cluster policy: no limit)."""
    match spec:
        case HivedSpec():
            return TenantAdmission(beyond=spec.opportunistic)
        case QuotaSpec():
            return TenantAdmission(beyond=False, quota=True)
        case QuotaBorrowSpec():
            return TenantAdmission(beyond=True, quota=True)
        case _:
            return TenantAdmission()


def schedules_cores(spec: PolicySpec) -> bool:
    """Whether ``spec`` schedules CPU cores (a core layer around its inner
    policy), hence may take CPU jobs."""
    return isinstance(spec, CORE_TYPES)


def profiling_settings(spec: HopsSettings | SiaSettings | GavelSettings) -> ProfilingSettings:
    """The profiling-first layer's settings in ``spec`` (every policy takes
    the same three, with the same defaults)."""
    return ProfilingSettings(spec.profile_gpus, spec.profile_share, spec.profile_preempt)


def _inner(spec: ClusterSpec) -> LayeredPolicy:
    match spec:
        case HopsSpec() | HopsProfilePreemptSpec() | HopsPaperSpec():
            return HopsPolicy(spec)
        case SiaSpec() | SiaLpStartSpec() | SiaEstimatorSpec():
            return SiaPolicy(spec)
        case GavelSpec():
            return GavelPolicy(spec)
        case _:
            assert_never(spec)


def make_task_policy(name: str) -> TaskPolicy:
    """The task-level policy ``name`` (:data:`TASK_POLICIES`, and ``hare``
    or ``hare-eft`` with ``:ties=order``)."""
    try:
        return task_policy(name)
    except ValueError:
        raise PolicyError(
            f"unknown task policy {name!r}; known: {', '.join(TASK_POLICIES)}") from None


def _spec_type(name: str) -> type[PolicySpec]:
    try:
        return SPECS[name]
    except KeyError:
        if name in TASK_POLICIES:
            raise PolicyError(
                f"{name!r} is a task-level policy for relaxed-sync jobs (hare.md): "
                "it runs under `hops experiment hare`, not in rounds") from None
        known = ", ".join((*POLICIES, *TENANT_POLICIES))
        raise PolicyError(f"unknown policy {name!r}; known: {known}") from None


def _text(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
