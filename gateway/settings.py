"""Settings of the HTTP gateway: environment variables, overridable by flags.

==========================  ================  =============  ==============================
variable                    flag              default        meaning
==========================  ================  =============  ==============================
``HOPS_GATEWAY_HOST``       ``--host``        ``127.0.0.1``  address to listen on
``HOPS_GATEWAY_PORT``       ``--port``        ``8080``       port to listen on (0: any free)
``HOPS_GATEWAY_TIMEOUT_S``  ``--timeout-s``   ``5`` (``9``   how long to wait for a reply on NATS
                                              on a NATS      (on a cluster: long enough for a
                                              cluster)       leader election, not the 10 s of
                                                             ``hops submit``'s own timeout)
``HOPS_TENANTS``            ``--tenants``     none           the tenants file: bearer tokens
                                                             of tenants and admins
``HOPS_GATEWAY_INSECURE``   ``--insecure``    off            ``1``: serve without a tenants
                                                             file, every caller an admin
``HOPS_GATEWAY_CERT``       ``--tls-cert``    none           certificate (PEM): serve HTTPS
``HOPS_GATEWAY_KEY``        ``--tls-key``     none           its private key (PEM)
``HOPS_UI_SAMPLE_S``        none              ``10``         the dashboard's plots: seconds
                                                             between samples (the last 720
                                                             are kept: two hours)
==========================  ================  =============  ==============================

Without a tenants file the gateway refuses to start unless told
``--insecure``: an open gateway lets anyone run anything, so it must be a
decision (a measurement, a machine of one's own), never an omission.
``HOPS_GATEWAY_INSECURE`` is a switch (:func:`~services.runtime.settings.env_bool`:
``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``); any other
value stops the gateway.

plus the runtime's ``HOPS_NATS_URL``, ``HOPS_NATS_CREDS``, ``HOPS_LOG_LEVEL``
and ``HOPS_LEADER_TTL`` (:mod:`services.runtime.settings`). The gateway
serves its own ``/healthz`` on its port, so ``HOPS_HEALTH_PORT`` is unused.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduling.live.lease import ELECTION_STALL_S
from services.runtime.settings import (
    RuntimeSettings,
    SettingsError,
    build_parser,
    env_bool,
    env_float,
    env_int,
    parse_args,
)
from shared import ports
from shared.events import MAX_PAYLOAD
from shared.tenants import TENANTS_ENV

DEFAULT_HOST = ports.LOOPBACK
DEFAULT_PORT = ports.GATEWAY_PORT
REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GatewaySettings:
    """What the gateway needs; see the module docstring."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    request_timeout: float = REQUEST_TIMEOUT_S
    max_body: int = MAX_PAYLOAD
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    tenants: str = ""  # path of the tenants file
    insecure: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    ui_sample_s: float = 10.0

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("HTTPS needs both HOPS_GATEWAY_CERT and HOPS_GATEWAY_KEY "
                                "(--tls-cert and --tls-key), or neither")


def request_timeout(runtime: RuntimeSettings) -> float:
    """The default wait for a reply: on a NATS cluster, long enough for a
    submission whose publish waits out a JetStream leader election
    (:data:`~scheduling.live.lease.ELECTION_STALL_S`), so that it is
    accepted at the first attempt rather than answered 503 and retried."""
    return REQUEST_TIMEOUT_S if runtime.nats_replicas == 1 else ELECTION_STALL_S + 1.0


def _port(name: str, value: int) -> int:
    if not 0 <= value <= 65535:
        raise SettingsError(f"{name} must be a port number in 0..65535, got {value}")
    return value


def from_env(
    env: Mapping[str, str] | None = None, runtime: RuntimeSettings | None = None
) -> GatewaySettings:
    """Gateway settings from the environment (``os.environ`` unless ``env``)."""
    source = os.environ if env is None else env
    host = source.get("HOPS_GATEWAY_HOST", "").strip() or DEFAULT_HOST
    port = _port("HOPS_GATEWAY_PORT", env_int("HOPS_GATEWAY_PORT", DEFAULT_PORT, env=source))
    runtime = runtime or RuntimeSettings()
    timeout = env_float("HOPS_GATEWAY_TIMEOUT_S", request_timeout(runtime), env=source,
                        minimum=0.01)
    return GatewaySettings(
        host=host, port=port, request_timeout=timeout, runtime=runtime,
        tenants=source.get(TENANTS_ENV, "").strip(),
        insecure=env_bool("HOPS_GATEWAY_INSECURE", False, env=source),
        tls_cert=source.get("HOPS_GATEWAY_CERT", "").strip(),
        tls_key=source.get("HOPS_GATEWAY_KEY", "").strip(),
        ui_sample_s=env_float("HOPS_UI_SAMPLE_S", 10.0, env=source, minimum=0.1),
    )


def parse(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> GatewaySettings:
    """Settings from the environment, overridden by the flags in ``argv``."""
    parser: argparse.ArgumentParser = build_parser("gateway")
    parser.add_argument("--host", help="overrides $HOPS_GATEWAY_HOST")
    parser.add_argument("--port", type=int, help="overrides $HOPS_GATEWAY_PORT")
    parser.add_argument("--timeout-s", type=float, help="overrides $HOPS_GATEWAY_TIMEOUT_S")
    parser.add_argument("--tenants", metavar="FILE", help="overrides $HOPS_TENANTS")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="serve without a tenants file: every caller is an admin")
    parser.add_argument("--tls-cert", metavar="PEM", help="overrides $HOPS_GATEWAY_CERT")
    parser.add_argument("--tls-key", metavar="PEM", help="overrides $HOPS_GATEWAY_KEY")
    runtime, args = parse_args(argv, service="gateway", parser=parser, env=env)
    base = from_env(env, runtime)
    if args.timeout_s is not None and args.timeout_s <= 0:
        raise SettingsError(f"--timeout-s must be > 0, got {args.timeout_s}")
    return GatewaySettings(
        host=args.host or base.host,
        port=_port("--port", args.port) if args.port is not None else base.port,
        request_timeout=args.timeout_s or base.request_timeout,
        runtime=runtime,
        tenants=args.tenants or base.tenants,
        insecure=args.insecure or base.insecure,
        tls_cert=args.tls_cert or base.tls_cert,
        tls_key=args.tls_key or base.tls_key,
    )
