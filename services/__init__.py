"""The live system's asyncio services, each a thin shell over the pure core.

One folder per service, each run as ``python -m services.<name>``: the
``scheduler`` (admission, the leader lease and the rounds' plans), the
``estimator`` (the multi-layer throughput database served over NATS), the
``profiler`` (profile reports into ``job_profiled``), the ``placer`` (a plan
into the executors' start and stop commands) and the ``monitor`` (nodes,
heartbeats, releases and metrics). ``runtime`` is what they share: settings,
logging, the NATS connection, consumers and the health endpoint. The events
they exchange are :mod:`shared.events` (docs/events.md).
"""
