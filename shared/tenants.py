"""Tenants and their credentials: the tenants file (docs/security.md).

One YAML file names every tenant, the bearer tokens that act for it and
whether its jobs may run their own ``command``; and the admins, whose
tokens see and do everything. ``hops up --tenants FILE`` loads it (and
compose mounts it); the gateway authenticates HTTP requests with it and
the scheduler's admission asks it whether a tenant may run commands.
Without a file there is one tenant, ``default``, that may run commands:
the operator started the system on their own machine.

Tokens are stored as ``sha256:<hex>`` digests (or, accepted on input, as
plain strings, as in Kubernetes' static token file); a presented token is
compared by digest in constant time. Later sections are added as fields
with defaults, so a file keeps loading: ``cells`` holds the tenants'
virtual clusters and the cells they reserve, in HiveD's vocabulary (the
document :func:`scheduling.cells.cells_from_doc` reads: ``cell_types``,
``physical_cells``, ``virtual_clusters``; docs/tenancy.md). It is kept here
as parsed YAML and checked against a cluster by
:mod:`scheduling.live.cells`, which knows the servers.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from shared.subjects import SubjectError, check_token

DIGEST_PREFIX = "sha256:"
DEFAULT_TENANT = "default"
# The variable naming the (effective) tenants file, for the gateway and the scheduler.
TENANTS_ENV = "HOPS_TENANTS"
_HEX = frozenset("0123456789abcdef")
# A tenant's name is the first part of its jobs' keys (``alice/j1``,
# shared/jobkeys.py): a KV key's characters, and never the '/' that ends it.
_TENANT_NAME = re.compile(r"[A-Za-z0-9_=-]+")


class TenantsError(ValueError):
    """The tenants file cannot be used; the message names the field."""


class TenantSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One tenant: its bearer tokens, and whether its jobs may run a command."""

    tokens: tuple[str, ...] = ()
    run_commands: bool = False


class AdminSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One admin: its bearer tokens."""

    tokens: tuple[str, ...] = ()


class TenantsFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole file."""

    tenants: dict[str, TenantSpec] = msgspec.field(default_factory=dict)
    admins: dict[str, AdminSpec] = msgspec.field(default_factory=dict)
    # HiveD's cell specification (None: no cells); see the module docstring
    cells: dict[str, Any] | None = None


class Principal(msgspec.Struct, frozen=True):
    """Who a credential acts for: a tenant, or an admin (``tenant`` None)."""

    name: str
    tenant: str | None = None
    admin: bool = False


DEFAULT_TENANTS = TenantsFile(tenants={DEFAULT_TENANT: TenantSpec(run_commands=True)})


def token_digest(token: str) -> str:
    """The stored form of ``token``: ``sha256:<hex>``."""
    return DIGEST_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def _stored(entry: str) -> str:
    """A token as written in the file, as a digest."""
    if entry.startswith(DIGEST_PREFIX):
        return entry
    return token_digest(entry)


def _check_digest(entry: str, where: str) -> None:
    if not entry:
        raise TenantsError(f"{where}: a token must not be empty")
    if entry.startswith(DIGEST_PREFIX):
        hexpart = entry[len(DIGEST_PREFIX):]
        if len(hexpart) != 64 or not set(hexpart) <= _HEX:
            raise TenantsError(f"{where}: {entry[:20]}... is not sha256: and 64 hex digits")


def validate(file: TenantsFile) -> TenantsFile:
    """``file`` if every name can be a subject token, tokens are well formed
    and no token acts for two principals; else :class:`TenantsError`."""
    seen: dict[str, str] = {}
    entries = [(f"tenants.{n}", n, t.tokens) for n, t in file.tenants.items()]
    entries += [(f"admins.{n}", n, a.tokens) for n, a in file.admins.items()]
    for where, name, tokens in entries:
        try:
            check_token(name, "name")
        except SubjectError as e:
            raise TenantsError(f"{where}: {e}") from None
        if where.startswith("tenants.") and not _TENANT_NAME.fullmatch(name):
            raise TenantsError(f"{where}: a tenant name may only contain letters, digits, "
                               "'-', '_' and '=' (it is part of its jobs' KV keys)")
        for i, entry in enumerate(tokens):
            _check_digest(entry, f"{where}.tokens[{i}]")
            digest = _stored(entry)
            if digest in seen:
                raise TenantsError(
                    f"{where}.tokens[{i}]: the same token is given to {seen[digest]}")
            seen[digest] = where
    _check_cells_tenants(file)
    return file


def _check_cells_tenants(file: TenantsFile) -> None:
    """Every virtual cluster is a tenant's and every tenant has one, when
    the file has cells (the cells themselves are checked against a cluster
    by :mod:`scheduling.live.cells`)."""
    if file.cells is None:
        return
    vcs = file.cells.get("virtual_clusters")
    if not isinstance(vcs, dict):
        raise TenantsError("cells.virtual_clusters: the cells need a virtual cluster per tenant "
                           "(a mapping from tenant to its virtual_cells)")
    for name in vcs:
        if name not in file.tenants:
            raise TenantsError(f"cells.virtual_clusters.{name}: {name!r} is not a tenant "
                               f"(tenants: {', '.join(sorted(file.tenants)) or 'none'})")
    for name in file.tenants:
        if name not in vcs:
            raise TenantsError(f"cells.virtual_clusters: tenant {name} has no virtual cluster "
                               "(give it virtual_cells, or low_priority: true)")


def load_tenants(text: str) -> TenantsFile:
    """Parse and validate a tenants file (YAML)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TenantsError(f"not YAML: {e}") from None
    try:
        file = msgspec.convert(raw if raw is not None else {}, TenantsFile)
    except msgspec.ValidationError as e:
        raise TenantsError(f"tenants file: {e}") from None
    return validate(file)


def dump_tenants(file: TenantsFile) -> str:
    """``file`` as YAML, every token as its digest (what ``hops up`` writes)."""
    def digests(tokens: tuple[str, ...]) -> list[str]:
        return [_stored(t) for t in tokens]

    data: dict[str, Any] = {
        "tenants": {n: {"tokens": digests(t.tokens), "run_commands": t.run_commands}
                    for n, t in file.tenants.items()},
        "admins": {n: {"tokens": digests(a.tokens)} for n, a in file.admins.items()},
    }
    if file.cells is not None:
        data["cells"] = file.cells
    return yaml.safe_dump(data, sort_keys=True)


def _matches(token_digest_: str, tokens: tuple[str, ...]) -> bool:
    found = False
    for entry in tokens:  # no early exit: the time does not tell which matched
        found |= hmac.compare_digest(token_digest_, _stored(entry))
    return found


def authenticate(file: TenantsFile, token: str) -> Principal | None:
    """Who ``token`` acts for, None if nobody."""
    if not token:
        return None
    presented = token_digest(token)
    for name, admin in file.admins.items():
        if _matches(presented, admin.tokens):
            return Principal(name=name, admin=True)
    for name, tenant in file.tenants.items():
        if _matches(presented, tenant.tokens):
            return Principal(name=name, tenant=name)
    return None


def may_run_commands(file: TenantsFile, tenant: str) -> bool:
    """Whether ``tenant``'s jobs may carry a ``command`` (unknown: no)."""
    spec = file.tenants.get(tenant)
    return spec is not None and spec.run_commands


def with_tokens(file: TenantsFile, tenants: Mapping[str, str], admins: Mapping[str, str]
                ) -> TenantsFile:
    """``file`` with one more token for each named tenant and admin (an admin
    not in the file is added): how ``hops up`` adds the tokens it generated."""
    new_tenants = {n: msgspec.structs.replace(t, tokens=(*t.tokens, tenants[n]))
                   if n in tenants else t for n, t in file.tenants.items()}
    new_admins = dict(file.admins)
    for name, token in admins.items():
        old = new_admins.get(name, AdminSpec())
        new_admins[name] = msgspec.structs.replace(old, tokens=(*old.tokens, token))
    return validate(TenantsFile(tenants=new_tenants, admins=new_admins, cells=file.cells))


def read_tenants(path: str | Path) -> TenantsFile:
    """The tenants file at ``path``; :class:`TenantsError` naming the path
    when it cannot be read or used."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TenantsError(f"cannot read the tenants file {path}: {e.strerror or e}") from None
    try:
        return load_tenants(text)
    except TenantsError as e:
        raise TenantsError(f"{path}: {e}") from None


def tenants_from_env(env: Mapping[str, str]) -> TenantsFile | None:
    """The file ``$HOPS_TENANTS`` names, None when it is unset or empty."""
    path = env.get(TENANTS_ENV, "").strip()
    return read_tenants(path) if path else None
