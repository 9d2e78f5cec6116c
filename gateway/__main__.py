"""``python -m gateway``: serve the HTTP gateway with uvicorn.

Settings are in :mod:`gateway.settings` (``HOPS_GATEWAY_HOST``,
``HOPS_GATEWAY_PORT``, ``HOPS_GATEWAY_TIMEOUT_S``, the tenants file
``HOPS_TENANTS``, HTTPS ``HOPS_GATEWAY_CERT``/``HOPS_GATEWAY_KEY`` and the
runtime's ``HOPS_NATS_URL``...); ``--help`` lists the flags. Without a
tenants file it refuses to start, unless ``--insecure``. Logs are JSON lines on
stdout, uvicorn's included. SIGINT/SIGTERM stop it cleanly: uvicorn finishes
the requests in flight, then the lifespan drains the NATS connection.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn

from gateway.app import create_app
from gateway.reload import reload_gateway
from gateway.settings import GatewaySettings, parse
from services.runtime.logging import configure_logging
from services.runtime.settings import SettingsError
from shared.tenants import TenantsError, TenantsFile, read_tenants


def _exit_cleanly(_sig: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _tenants(settings: GatewaySettings) -> TenantsFile | None:
    """The tenants file; None only when the operator said ``--insecure``."""
    if settings.tenants:
        return read_tenants(settings.tenants)
    if not settings.insecure:
        raise SettingsError(
            "no tenants file: set HOPS_TENANTS (or --tenants) to authenticate requests, or "
            "say --insecure (HOPS_GATEWAY_INSECURE=1) to let every caller act as an admin"
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse(argv)
        tenants = _tenants(settings)
    except (SettingsError, TenantsError) as e:
        print(f"hops gateway: {e}", file=sys.stderr)
        return 2
    log = configure_logging("gateway", settings.runtime.log_level)
    https = bool(settings.tls_cert)
    log.info("gateway starting", host=settings.host, port=settings.port, https=https,
             tenants=sorted(tenants.tenants) if tenants else None)
    if tenants is None:
        log.warning("gateway is insecure: no tenants file, every caller is an admin")
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal
    # again under the handlers it found: make that a clean exit (0), as the
    # other services' is, rather than death by signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    app = create_app(settings, tenants=tenants)
    # SIGHUP reloads the tenants file (its tokens), as POST /tenants/reload does
    signal.signal(signal.SIGHUP, lambda *_: reload_gateway(app.state, log))
    # log_config=None: uvicorn's loggers go through the JSON handler set above.
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
