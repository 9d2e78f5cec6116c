"""Where the live system listens unless told otherwise: one definition of
each default, which the services, the gateway, the monitor, ``hops up`` and
the command-line client all name (their flags and variables override it).

Every endpoint binds the loopback address by default (docs/security.md):
opening one to other hosts is an operator's decision, never a default.
"""

from __future__ import annotations

LOOPBACK = "127.0.0.1"
NATS_PORT = 4222  # nats-server's own default client port
GATEWAY_PORT = 8080
METRICS_PORT = 9464  # the OpenTelemetry Prometheus exporter's customary port
NATS_URL = f"nats://{LOOPBACK}:{NATS_PORT}"
GATEWAY_URL = f"http://{LOOPBACK}:{GATEWAY_PORT}"
