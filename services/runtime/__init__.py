"""The imperative shell every Hops service shares: settings, JSON logging, the
NATS connection and JetStream layout, request and consumer loops that never
crash on input, a health endpoint, an embedded nats-server, and the service
runner. The wire contract itself lives in :mod:`shared.events`."""
