"""Where the monitor serves ``GET /metrics``: the one definition of its
defaults, shared by the monitor (``HOPS_METRICS_HOST``/``--metrics-host``,
``HOPS_METRICS_PORT``/``--metrics-port``) and ``hops up``
(``--metrics-host``/``--metrics-port``).

The address is loopback unless configured: metrics tell anyone who can
read them which jobs run where, so opening them to a network is the
operator's choice (``0.0.0.0``, as compose.yaml does inside its container,
whose port it publishes to the host's loopback only).
"""

from __future__ import annotations

from services.runtime.settings import LOOPBACK, SettingsError
from shared import ports

DEFAULT_METRICS_HOST = LOOPBACK
DEFAULT_METRICS_PORT = ports.METRICS_PORT
METRICS_OFF = "off"


def metrics_port(raw: str) -> int | None:
    """``HOPS_METRICS_PORT``'s value: a port (0 picks a free one), or None for ``off``."""
    if raw.strip().lower() == METRICS_OFF:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise SettingsError(f"HOPS_METRICS_PORT must be a port or 'off', got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise SettingsError(f"HOPS_METRICS_PORT must be a port number, got {raw!r}")
    return port
