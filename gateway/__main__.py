"""``python -m gateway``: serve the HTTP gateway with uvicorn.

Settings are in :mod:`gateway.settings` (``HOPS_GATEWAY_HOST``,
``HOPS_GATEWAY_PORT``, ``HOPS_GATEWAY_TIMEOUT_S`` and the runtime's
``HOPS_NATS_URL``...); ``--help`` lists the flags. Logs are JSON lines on
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
from gateway.settings import parse
from services.runtime.logging import configure_logging
from services.runtime.settings import SettingsError


def _exit_cleanly(_sig: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse(argv)
    except SettingsError as e:
        print(f"hops gateway: {e}", file=sys.stderr)
        return 2
    log = configure_logging("gateway", settings.runtime.log_level)
    log.info("gateway starting", host=settings.host, port=settings.port)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal
    # again under the handlers it found: make that a clean exit (0), as the
    # other services' is, rather than death by signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    # log_config=None: uvicorn's loggers go through the JSON handler set above.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
