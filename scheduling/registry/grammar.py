"""The one grammar of policy specs, round-based and task-level alike: text
(``sia:lam=1.2``, ``hare:ties=order``, ``hived:inner=hops:lam=inf,sigma=1.6``)
or a JSON mapping (``{"name": "sia", "lam": 1.2}``) to a typed spec, and a
spec back to its shortest text (see :mod:`scheduling.registry`).

The specs that wrap a cluster policy (tenant and core policies) are here
too, beside the grammar: their ``inner`` is spec text in it, which they
parse to answer ``inner_spec`` and ``r_num``, and parsing them checks it.
The specs of one policy each are :mod:`.specs`'."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import msgspec

from scheduling.cores.settings import CodaSettings
from scheduling.priorities import priority_fn
from scheduling.registry.specs import (
    CLUSTER_TYPES,
    DEFAULT_INNER,
    ORDERED_OWN_WAY,
    POLICIES,
    TASK_POLICIES,
    TASK_SPECS,
    TASK_TYPES,
    TENANT_POLICIES,
    ClusterSpec,
    ExtensionSpec,
    PolicyError,
    TaskSpec,
)

S = TypeVar("S", bound=msgspec.Struct)
INNER = "inner"  # the setting that takes the rest of the text


# --- specs around a cluster policy (its ``inner`` text) ----------------------------------


class _TenantSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tenant layer around the cluster policy ``inner`` (its spec text)."""

    inner: str = DEFAULT_INNER

    @property
    def inner_spec(self) -> ClusterSpec:
        return _inner_of(self.inner, "is a {kind} policy; it must be a cluster policy")

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
        return _inner_of(self.inner).r_num


class FifoCoresSpec(msgspec.Struct, tag="fifo", tag_field="name", frozen=True,
                    forbid_unknown_fields=True):
    """Cores as requested, CPU jobs first come first served, around ``inner``."""

    inner: str = DEFAULT_INNER

    @property
    def r_num(self) -> int:
        return _inner_of(self.inner).r_num


class DrfCoresSpec(msgspec.Struct, tag="drf", tag_field="name", frozen=True,
                   forbid_unknown_fields=True):
    """Cores as requested, CPU jobs by their tenants' dominant share."""

    inner: str = DEFAULT_INNER

    @property
    def r_num(self) -> int:
        return _inner_of(self.inner).r_num


class FixedCoresSpec(msgspec.Struct, tag="fixed-cores", tag_field="name", frozen=True,
                     forbid_unknown_fields=True):
    """Slurm's ``--cpus-per-gpu``: ``per_gpu`` cores per GPU for every GPU
    job (0: each server's cores over its GPUs, rounded down)."""

    per_gpu: int = 0
    inner: str = DEFAULT_INNER

    @property
    def r_num(self) -> int:
        return _inner_of(self.inner).r_num


CoreSpec = CodaSpec | FifoCoresSpec | DrfCoresSpec | FixedCoresSpec
CORE_TYPES = (CodaSpec, FifoCoresSpec, DrfCoresSpec, FixedCoresSpec)

SPECS: Mapping[str, type[PolicySpec]] = {
    str(cls.__struct_config__.tag): cls
    for cls in (*CLUSTER_TYPES, *TENANT_TYPES, *CORE_TYPES)
}


def _inner_of(text: str, wrong: str | None = None) -> ClusterSpec:
    """The cluster spec a tenant or core spec wraps (its ``inner`` text);
    ``wrong`` words the error for a spec of another kind (``{kind}``)."""
    spec = parse_policy(text)
    if isinstance(spec, CLUSTER_TYPES):
        return spec
    if wrong is None:
        raise PolicyError(f"inner policy {text!r} must be a cluster policy "
                          f"({', '.join(POLICIES)})")
    kind = "tenant" if isinstance(spec, TENANT_TYPES) else "core"
    raise PolicyError(f"inner policy {text!r} {wrong.format(kind=kind)}")


# Every round-based spec (what ``parse_policy`` returns, ``make_policy`` builds).
PolicySpec = ClusterSpec | TenantSpec | CoreSpec | ExtensionSpec
_EXTENSIONS: dict[str, type[ExtensionSpec]] = {}


def register(spec_type: type[ExtensionSpec]) -> Callable[[], None]:
    """Add the policy of ``spec_type`` (its tag is its name) to every entry
    point; returns what takes it away again. A name already taken is an error."""
    name = str(spec_type.__struct_config__.tag)
    if name in SPECS or name in TASK_SPECS or name in _EXTENSIONS:
        raise PolicyError(f"policy {name!r} is registered already")
    _EXTENSIONS[name] = spec_type

    def undo() -> None:
        _EXTENSIONS.pop(name, None)

    return undo


def spec_type(name: str) -> type[AnySpec] | None:
    """The spec type named ``name``, of any kind; None when none is."""
    return SPECS.get(name) or TASK_SPECS.get(name) or _EXTENSIONS.get(name)


# Every spec the one grammar parses.
AnySpec = PolicySpec | TaskSpec


# --- the grammar -------------------------------------------------------------------------


def spec_name(text: str) -> str:
    """The name a spec's text (or JSON mapping) gives, its settings unread:
    for callers that pick an entry point by policy (``hops`` runs in
    rounds, ``hare`` task by task) before parsing with it."""
    text = text.strip()
    if text.startswith("{"):
        try:
            name = msgspec.json.decode(text, type=dict[str, object]).get("name")
        except msgspec.DecodeError as e:
            raise PolicyError(f"policy {text!r}: {e}") from None
        return name.strip() if isinstance(name, str) else ""
    return text.partition(":")[0].strip()


def parse_any(text: str) -> AnySpec:
    """Any spec from its text form: ``NAME[:SETTING=VALUE,...]``, where an
    ``inner=...`` setting comes last and takes the rest of the text, or a
    JSON mapping with the name in ``name``."""
    text = text.strip()
    if text.startswith("{"):
        try:
            mapping = msgspec.json.decode(text)
        except msgspec.DecodeError as e:
            raise PolicyError(f"policy {text!r}: {e}") from None
        if not isinstance(mapping, dict):
            raise PolicyError(f"policy {text!r}: expected a mapping")
        return _from_mapping(mapping)
    name, _, rest = text.partition(":")
    values: dict[str, object] = {}
    rest, inner = _split_inner(rest)
    if inner is not None:
        values[INNER] = inner
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise PolicyError(f"policy {text!r}: {item!r} is not SETTING=VALUE")
        values[key.strip()] = value.strip()
    return _from_mapping({"name": name.strip(), **values})


def parse_policy(text: str) -> PolicySpec:
    """A round-based spec from its text form; a task-level policy's name is
    an error that says where it runs."""
    return _round_based(parse_any(text))


def parse_task(text: str) -> TaskSpec:
    """A task-level spec (``hare``, ``hare-eft:ties=order``, ``srtf``) from
    its text form."""
    if spec_name(text) not in TASK_POLICIES:
        raise PolicyError(
            f"unknown task policy {text.strip()!r}; known: {', '.join(TASK_POLICIES)}")
    spec = parse_any(text)
    assert isinstance(spec, TASK_TYPES)
    return spec


def spec_from_mapping(mapping: Mapping[str, object]) -> PolicySpec:
    """A round-based spec from ``{"name": ..., setting: value, ...}``; values
    may be text (``"1.2"``, ``"true"``, ``"inf"``), converted to each
    setting's type."""
    return _round_based(_from_mapping(mapping))


def _from_mapping(mapping: Mapping[str, object]) -> AnySpec:
    values = dict(mapping)
    name = values.pop("name", None)
    if not isinstance(name, str):
        raise PolicyError(f"a policy spec needs a name; known: {', '.join(POLICIES)}")
    return with_settings(_spec_type(name)(), values)


def _round_based(spec: AnySpec) -> PolicySpec:
    if isinstance(spec, TASK_TYPES):
        raise PolicyError(
            f"{policy_name(spec)!r} is a task-level policy for relaxed-sync jobs (hare.md): "
            "it runs under `hops experiment hare`, not in rounds")
    return spec


def settings_of(name: str) -> tuple[str, ...]:
    """The settings policy ``name`` takes."""
    return tuple(f.name for f in msgspec.structs.fields(_spec_type(name)))


def with_settings(spec: S, values: Mapping[str, object]) -> S:
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
        new = msgspec.convert(fields, type=type(spec), strict=False)
    except (msgspec.ValidationError, ValueError) as e:
        raise PolicyError(f"policy {name}: {e}") from None
    check(new)
    return new


def resolve(text: str, **overrides: object) -> PolicySpec:
    """The spec ``text`` names with the settings in ``overrides`` that are
    not ``None`` (the command line's override flags that were given:
    ``--priority``, ``--lam``), each an error for a policy that does not
    take it."""
    spec = parse_policy(text)
    given = {k: v for k, v in overrides.items() if v is not None}
    return with_settings(spec, given) if given else spec


def _split_inner(rest: str) -> tuple[str, str | None]:
    """``rest`` without a trailing ``inner=...``, and that inner spec text."""
    for i, item in enumerate(rest.split(",")):
        if item.strip().startswith(f"{INNER}="):
            head = ",".join(rest.split(",")[:i])
            tail = ",".join(rest.split(",")[i:]).strip()
            return head, tail.partition("=")[2].strip()
    return rest, None


def check(spec: msgspec.Struct) -> None:
    """Errors that only building the policy would find (the priority's name,
    a tenant or core policy's inner spec)."""
    if isinstance(spec, TENANT_TYPES):
        try:
            _ = spec.inner_spec
        except PolicyError as e:
            raise PolicyError(f"policy {policy_name(spec)}: inner: {e}") from None
    elif isinstance(spec, CORE_TYPES):
        try:
            core_inner(spec)
        except PolicyError as e:
            raise PolicyError(f"policy {policy_name(spec)}: inner: {e}") from None
    elif isinstance(spec, CLUSTER_TYPES) and not isinstance(spec, ORDERED_OWN_WAY):
        try:
            priority_fn(spec.priority)
        except ValueError as e:
            raise PolicyError(f"policy {policy_name(spec)}: {e}") from None


def core_inner(spec: CoreSpec) -> ClusterSpec:
    """The cluster policy a core policy wraps (its ``inner`` text)."""
    return _inner_of(spec.inner)


def policy_name(spec: msgspec.Struct) -> str:
    """The name a spec is tagged with."""
    return str(spec.__struct_config__.tag)


def spec_text(spec: msgspec.Struct) -> str:
    """The text form of ``spec``: its name and the settings that differ from
    the named policy's defaults (``parse_any(spec_text(s)) == s``)."""
    name = policy_name(spec)
    base = msgspec.structs.asdict(type(spec)())
    items = msgspec.structs.asdict(spec).items()
    changed = [f"{k}={_text(v)}" for k, v in items if base[k] != v and k != INNER]
    inner = getattr(spec, INNER, base.get(INNER))
    changed += [f"{INNER}={inner}"] if inner != base.get(INNER) else []  # last: takes the rest
    return name + (":" + ",".join(changed) if changed else "")


def _spec_type(name: str) -> type[AnySpec]:
    found = spec_type(name)
    if found is None:
        known = ", ".join((*POLICIES, *TENANT_POLICIES))
        raise PolicyError(f"unknown policy {name!r}; known: {known}")
    return found


def _text(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
