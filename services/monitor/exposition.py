"""The monitor's metrics endpoint: ``GET /metrics`` in the Prometheus text
format, on the runtime's tiny HTTP server (no dependency). Anything else is
404 (405 for another method on ``/metrics``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from services.runtime.httpd import PLAIN, Response, TinyHttpServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServer:
    """Serves ``await render()`` on ``GET /metrics``."""

    def __init__(self, render: Callable[[], Awaitable[str]], *, host: str,
                 port: int = 0) -> None:
        self.render = render
        self.host = host
        self.port = port
        self._http = TinyHttpServer(self._handle, host=host, port=port)

    async def start(self) -> int:
        """Listen; return the bound port (an ephemeral one when ``port`` is 0)."""
        self.port = await self._http.start()
        return self.port

    async def stop(self) -> None:
        await self._http.stop()

    async def _handle(self, method: str, path: str) -> Response:
        if path != "/metrics":
            return 404, f"no such path {path}\n".encode(), PLAIN
        if method != "GET":
            return 405, f"method {method} not allowed\n".encode(), PLAIN
        try:
            return 200, (await self.render()).encode(), CONTENT_TYPE
        except Exception as e:  # a metrics bug must not take the endpoint down
            return 500, f"cannot render metrics: {e!r}\n".encode(), PLAIN
