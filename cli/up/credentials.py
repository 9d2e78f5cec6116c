"""The credentials folder of ``hops up`` (and of compose's secrets):
generated on first start, reused after (docs/security.md).

``<dir>/`` (mode 0700) holds, each file mode 0600:

* ``<identity>.nk``: the nkey user seed of each NATS identity
  (:mod:`services.runtime.identity`); never regenerated once there;
* ``admin.token`` and ``tenant-<name>.token``: HTTP bearer tokens, for the
  admin and for each tenant to which the tenants file gives no token;
* ``tenants.yaml``: the effective tenants file (the operator's, with the
  generated tokens added as digests), what the scheduler and the gateway
  read (``HOPS_TENANTS``);
* ``nats-auth.conf``: nats-server's ``authorization {}`` block with the
  public key and permissions of every seed in the folder, so that an
  executor enrolled later (:func:`enrol`) keeps its place.

A shell around the pure :mod:`services.runtime.identity` and
:mod:`shared.tenants`: only files here.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nkeys

from services.runtime.identity import (
    ADMIN,
    AUDIT,
    SERVICES,
    IdentityError,
    check_identity,
    executor_identity,
    render_authorization,
    tenant_identity,
)
from shared.tenants import DEFAULT_TENANTS, TenantsFile, dump_tenants, with_tokens

SEED_SUFFIX = ".nk"
TOKEN_SUFFIX = ".token"
AUTH_CONF = "nats-auth.conf"
TENANTS_FILE = "tenants.yaml"
CLI_CONFIG = "cli.yaml"
ADMIN_NAME = "admin"  # the admin entry hops adds to the tenants file


class CredentialsError(RuntimeError):
    """The credentials folder cannot be used; the message says why."""


@dataclass(frozen=True)
class Credentials:
    """Where the files of one credentials folder are."""

    dir: Path

    def seed(self, identity: str) -> Path:
        return self.dir / f"{check_identity(identity)}{SEED_SUFFIX}"

    def token(self, identity: str) -> Path:
        return self.dir / f"{check_identity(identity)}{TOKEN_SUFFIX}"

    @property
    def auth_conf(self) -> Path:
        return self.dir / AUTH_CONF

    @property
    def tenants_file(self) -> Path:
        return self.dir / TENANTS_FILE


def stack_identities(servers: Iterable[str], tenants: Iterable[str]) -> tuple[str, ...]:
    """Every identity a stack needs: the services, the admin, the audit
    user, one executor per server and one client per tenant."""
    return (*SERVICES, ADMIN, AUDIT, *(executor_identity(s) for s in servers),
            *(tenant_identity(t) for t in tenants))


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)  # also a folder made before, or under another umask


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``path`` atomically, readable by its owner only from the start
    (never briefly world-readable)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)  # the umask may have taken bits away
    finally:
        os.close(fd)
    os.replace(tmp, path)


def new_seed() -> bytes:
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    return str(nkeys.from_seed(bytearray(seed.strip())).public_key.decode())


def ensure_credentials(dir: Path, identities: Iterable[str], mode: int = 0o600
                       ) -> dict[str, str]:
    """A seed file for each of ``identities`` (existing ones are kept);
    returns public key -> identity of every seed in ``dir``."""
    _private_dir(dir)
    creds = Credentials(dir)
    for identity in identities:
        path = creds.seed(identity)
        if not path.exists():
            write_private(path, new_seed(), mode)
    return users(dir)


def users(dir: Path) -> dict[str, str]:
    """Public key -> identity of every seed file in ``dir``."""
    out: dict[str, str] = {}
    for path in sorted(dir.glob(f"*{SEED_SUFFIX}")):
        try:
            identity = check_identity(path.stem)
            out[public_key(path.read_bytes())] = identity
        except (IdentityError, ValueError, nkeys.ErrInvalidSeed) as e:
            raise CredentialsError(f"{path}: not a seed of an identity ({e})") from None
    return out


def write_auth(dir: Path, mode: int = 0o600) -> Path:
    """(Re)write ``nats-auth.conf`` from every seed in ``dir``."""
    path = Credentials(dir).auth_conf
    write_private(path, render_authorization(users(dir)).encode(), mode)
    return path


def ensure_token(path: Path, mode: int = 0o600) -> str:
    """The token in ``path``, generated on first use."""
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(32)
    write_private(path, (token + "\n").encode(), mode)
    return token


def effective_tenants(dir: Path, source: TenantsFile | None, mode: int = 0o600
                      ) -> TenantsFile:
    """The operator's tenants file (the default tenant without one) with a
    generated token for each tenant that has none and for the admin;
    written to ``tenants.yaml`` (digests only)."""
    source = source if source is not None else DEFAULT_TENANTS
    creds = Credentials(dir)
    tokens = {name: ensure_token(creds.token(tenant_identity(name)), mode)
              for name, spec in source.tenants.items() if not spec.tokens}
    admin = ensure_token(creds.token(ADMIN), mode)
    file = with_tokens(source, tokens, {ADMIN_NAME: admin})
    write_private(creds.tenants_file, dump_tenants(file).encode(), mode)
    return file


def prepare(dir: Path, servers: Iterable[str], tenants: TenantsFile | None,
            mode: int = 0o600) -> Credentials:
    """Everything a stack needs in ``dir``: seeds, tokens, the effective
    tenants file and nats-auth.conf. ``mode`` 0644 is for compose, whose
    containers run as another user (the folder stays 0700)."""
    _private_dir(dir)
    file = effective_tenants(dir, tenants, mode)
    ensure_credentials(dir, stack_identities(servers, file.tenants), mode)
    write_auth(dir, mode)
    return Credentials(dir)


def write_cli_config(path: Path, gateway: str, token: str) -> Path:
    """The CLI's config file (``hops`` reads it by default): where the
    gateway is and the admin's token."""
    write_private(path, f"gateway: {gateway}\ntoken: {token}\n".encode())
    return path


def enrol(dir: Path, server_id: str) -> Path:
    """Issue the credential of the executor of ``server_id`` (kept if it
    exists) and rewrite nats-auth.conf; the seed's path."""
    if not Credentials(dir).auth_conf.exists():
        raise CredentialsError(f"no credentials in {dir}: start `hops up` there first")
    identity = executor_identity(server_id)
    ensure_credentials(dir, (identity,))
    write_auth(dir)
    return Credentials(dir).seed(identity)


def reload_nats(state_file: Path) -> str:
    """SIGHUP the nats-servers of a running ``hops up`` (their pids are in
    ``up.json``): they read the authorization again. What happened."""
    try:
        state = json.loads(state_file.read_text())
        pids = [int(s["pid"]) for s in state.get("nats_servers") or [state["nats"]]]
        for pid in pids:
            os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "nats-server is not running here: the credential is admitted at its next start"
    return f"nats-server (pid {', '.join(map(str, pids))}) reloaded its authorization"
