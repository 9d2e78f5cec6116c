"""The HTTP gateway of the live system (``python -m gateway``): a FastAPI app
over the same NATS subjects and KV buckets as every other client
(:mod:`gateway.app`; the contract is docs/events.md)."""
