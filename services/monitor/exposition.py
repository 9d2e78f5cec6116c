"""The monitor's metrics endpoint: ``prometheus_client``'s own HTTP server
(:func:`prometheus_client.start_http_server`, a thread) on the monitor's
registry, in the Prometheus text format (or OpenMetrics, as the scraper's
``Accept`` asks).

A scrape runs on that thread; the families that read the buckets are
computed on the monitor's event loop (``families``, awaited there with
:func:`asyncio.run_coroutine_threadsafe`), so that the loop's state is only
ever read by the loop. The event-fed histograms and counters
(:mod:`services.monitor.instruments`) are the client's own, safe to read
from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

SCRAPE_TIMEOUT_S = 10.0  # Prometheus' own default scrape timeout

Families = Callable[[], Awaitable[list[Metric]]]


class _LoopFamilies(Collector):
    """Collects ``families()`` from the event loop ``loop`` (called on the
    server's thread; never on the loop itself, which would wait on itself)."""

    def __init__(self, families: Families, loop: asyncio.AbstractEventLoop) -> None:
        self.families = families
        self.loop = loop

    def collect(self) -> Iterable[Metric]:
        future = asyncio.run_coroutine_threadsafe(self._families(), self.loop)
        return future.result(SCRAPE_TIMEOUT_S)

    async def _families(self) -> list[Metric]:
        return await self.families()


class MetricsServer:
    """Serves ``registry`` and ``await families()`` on ``GET /metrics``."""

    def __init__(self, families: Families, registry: CollectorRegistry, *, host: str,
                 port: int = 0) -> None:
        self.families = families
        self.registry = registry
        self.host = host
        self.port = port
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> int:
        """Listen; return the bound port (an ephemeral one when ``port`` is 0)."""
        self.registry.register(_LoopFamilies(self.families, asyncio.get_running_loop()))
        self._httpd, self._thread = start_http_server(self.port, addr=self.host,
                                                      registry=self.registry)
        self.port = int(self._httpd.server_port)
        return self.port

    async def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            # shutdown waits for the serving thread, which may be waiting on
            # this loop for a scrape's families: wait off the loop
            await asyncio.to_thread(httpd.shutdown)
            httpd.server_close()
