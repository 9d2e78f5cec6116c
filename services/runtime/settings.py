"""Runtime settings of a service: environment variables, overridable by flags.

=====================  ==========================  ===========================
variable               flag                        default
=====================  ==========================  ===========================
``HOPS_NATS_URL``      ``--nats-url``              ``nats://127.0.0.1:4222``
``HOPS_NATS_CREDS``    ``--nats-creds``            none
``HOPS_NATS_NKEY``     ``--nats-nkey``             none (anonymous)
``HOPS_NATS_CA``       ``--nats-ca``               none (the system's CAs)
``HOPS_HEALTH_PORT``   ``--health-port``           none (no health endpoint)
``HOPS_HEALTH_HOST``   ``--health-host``           ``127.0.0.1``
``HOPS_LOG_LEVEL``     ``--log-level``             ``info``
``HOPS_LEADER_TTL``    ``--leader-ttl``            ``5`` seconds
``HOPS_NATS_REPLICAS`` ``--nats-replicas``         ``1``
=====================  ==========================  ===========================

``HOPS_NATS_URL`` may list several servers separated by commas: the members
of a NATS cluster, every one of them, so that a service reaches the cluster
while any member is down. ``HOPS_NATS_REPLICAS`` is how many copies
JetStream keeps of every stream and KV bucket (3 on a cluster of three;
docs/live.md, *A NATS cluster*).
``HOPS_NATS_NKEY`` is the file of this process's nkey seed: its name
without ``.nk`` is the identity (docs/security.md), whose replies come on
``_INBOX.<identity>``. ``HOPS_NATS_CA`` verifies a ``tls://`` server. A health
port of 0 binds an ephemeral port. Every endpoint binds loopback
(:data:`LOOPBACK`) unless configured otherwise, as nats-server and the
gateway do; a container sets ``0.0.0.0`` so that its peers reach it.
Service-specific knobs use :func:`env_float`/:func:`env_int`, switches
:func:`env_bool` (``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``,
in any case). Every bad value raises :class:`SettingsError` naming the
variable or flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

from shared import ports

LOOPBACK = ports.LOOPBACK
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
T = TypeVar("T")
# Copies of each stream and bucket: one, on today's single nats-server.
DEFAULT_REPLICAS = 1


class SettingsError(ValueError):
    """A setting has a value the service cannot use."""


@dataclass(frozen=True)
class RuntimeSettings:
    """What every service needs to run; see the module docstring."""

    nats_servers: tuple[str, ...] = (ports.NATS_URL,)
    nats_creds: str | None = None
    nats_nkey: str | None = None
    nats_ca: str | None = None
    health_port: int | None = None
    health_host: str = LOOPBACK
    log_level: str = "info"
    leader_ttl: float = 5.0
    nats_replicas: int = DEFAULT_REPLICAS
    connect_timeout: float = 2.0
    reconnect_wait: float = 1.0
    drain_timeout: float = 5.0

    @property
    def nats_url(self) -> str:
        return ",".join(self.nats_servers)


def _number(name: str, raw: str, kind: Callable[[str], T], minimum: float | None) -> T:
    try:
        value = kind(raw.strip())
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise SettingsError(f"{name} must be {what}, got {raw!r}") from None
    if minimum is not None and value < minimum:  # type: ignore[operator]
        raise SettingsError(f"{name} must be >= {minimum}, got {raw!r}")
    return value


def env_float(
    name: str,
    default: float,
    *,
    env: Mapping[str, str] | None = None,
    minimum: float | None = 0.0,
) -> float:
    """The float in environment variable ``name``, or ``default`` when unset or empty."""
    raw = (os.environ if env is None else env).get(name, "")
    return default if not raw.strip() else _number(name, raw, float, minimum)


def env_int(
    name: str,
    default: int,
    *,
    env: Mapping[str, str] | None = None,
    minimum: int | None = 0,
) -> int:
    """The integer in environment variable ``name``, or ``default`` when unset or empty."""
    raw = (os.environ if env is None else env).get(name, "")
    return default if not raw.strip() else _number(name, raw, int, minimum)


# The spellings of a switch, matched stripped and case-insensitively; any
# other value is refused rather than read as off (a typo must not turn a
# safety switch off silently).
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_bool(
    name: str,
    default: bool,
    *,
    env: Mapping[str, str] | None = None,
) -> bool:
    """The switch in environment variable ``name``, or ``default`` when unset or empty."""
    raw = (os.environ if env is None else env).get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name} must be on ({', '.join(_TRUE)}) or off "
                        f"({', '.join(_FALSE)}), got {raw!r}")


def _servers(name: str, raw: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in raw.split(",") if u.strip())
    if not urls:
        raise SettingsError(f"{name} must name at least one server")
    for url in urls:
        if not url.startswith(_SCHEMES) or url.endswith("//"):
            schemes = ", ".join(_SCHEMES)
            raise SettingsError(f"{name}: {url!r} is not a NATS URL ({schemes}host:port)")
    return urls


def _port(name: str, raw: str) -> int | None:
    if not raw.strip():
        return None
    port = _number(name, raw, int, 0)
    if port > 65535:
        raise SettingsError(f"{name} must be a port number <= 65535, got {raw!r}")
    return port


def _level(name: str, raw: str) -> str:
    level = raw.strip().lower()
    if level not in LOG_LEVELS:
        raise SettingsError(f"{name} must be one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return level


def _file(what: str) -> Callable[[str, str], str | None]:
    def parse(name: str, raw: str) -> str | None:
        path = raw.strip()
        if path and not os.path.isfile(path):
            raise SettingsError(f"{name}: {what} {path!r} does not exist")
        return path or None

    return parse


_creds = _file("credentials file")


class _Field(NamedTuple):
    name: str
    var: str
    flag: str
    parse: Callable[[str, str], object]


_FIELDS = (
    _Field("nats_servers", "HOPS_NATS_URL", "--nats-url", _servers),
    _Field("nats_creds", "HOPS_NATS_CREDS", "--nats-creds", _creds),
    _Field("nats_nkey", "HOPS_NATS_NKEY", "--nats-nkey", _file("nkey seed file")),
    _Field("nats_ca", "HOPS_NATS_CA", "--nats-ca", _file("CA file")),
    _Field("health_port", "HOPS_HEALTH_PORT", "--health-port", _port),
    _Field("health_host", "HOPS_HEALTH_HOST", "--health-host", lambda _n, raw: raw.strip()),
    _Field("log_level", "HOPS_LOG_LEVEL", "--log-level", _level),
    _Field("leader_ttl", "HOPS_LEADER_TTL", "--leader-ttl", lambda n, r: _number(n, r, float, 1.0)),
    _Field("nats_replicas", "HOPS_NATS_REPLICAS", "--nats-replicas",
           lambda n, r: _number(n, r, int, 1)),
)


def _apply(
    settings: RuntimeSettings, values: Mapping[str, str | None], flags: bool
) -> RuntimeSettings:
    """``settings`` with the fields present in ``values`` (keyed by flag when
    ``flags``, else by environment variable) parsed and replaced."""
    changes: dict[str, object] = {}
    for field in _FIELDS:
        key = field.flag if flags else field.var
        raw = values.get(key)
        if raw is not None:
            changes[field.name] = field.parse(key, raw)
    return replace(settings, **changes)  # type: ignore[arg-type]


def from_env(env: Mapping[str, str] | None = None) -> RuntimeSettings:
    """Settings from the environment (``os.environ`` unless ``env`` is given)."""
    source = os.environ if env is None else env
    return _apply(RuntimeSettings(), source, flags=False)


def build_parser(service: str) -> argparse.ArgumentParser:
    """An argument parser with the common flags; a service adds its own."""
    parser = argparse.ArgumentParser(prog=f"hops-{service}")
    for field in _FIELDS:
        parser.add_argument(field.flag, metavar="VALUE", help=f"overrides ${field.var}")
    return parser


def parse_args(
    argv: Sequence[str] | None,
    *,
    service: str = "service",
    parser: argparse.ArgumentParser | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[RuntimeSettings, argparse.Namespace]:
    """Settings from the environment, overridden by the flags in ``argv``;
    also the parsed namespace, for the service's own flags (``parser``, from
    :func:`build_parser`)."""
    args = (parser or build_parser(service)).parse_args(argv)
    values = {f.flag: getattr(args, f.flag[2:].replace("-", "_")) for f in _FIELDS}
    return _apply(from_env(env), values, flags=True), args
