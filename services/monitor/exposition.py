"""The monitor's metrics endpoint: ``GET /metrics`` in the Prometheus text
format, on ``asyncio.start_server`` (no dependency). Anything else is 404
(405 for another method on ``/metrics``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error"}
_READ_TIMEOUT_S = 5.0
_MAX_HEADER_LINES = 100


class MetricsServer:
    """Serves ``render()`` on ``GET /metrics``."""

    def __init__(self, render: Callable[[], str], *, host: str = "0.0.0.0", port: int = 0
                 ) -> None:
        self.render = render
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; return the bound port (an ephemeral one when ``port`` is 0)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            code, body, ctype = await asyncio.wait_for(self._route(reader), _READ_TIMEOUT_S)
            payload = body.encode()
            head = (
                f"HTTP/1.1 {code} {_REASONS[code]}\r\n"
                f"Content-Type: {ctype}\r\n"
                f"Content-Length: {len(payload)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _route(self, reader: asyncio.StreamReader) -> tuple[int, str, str]:
        parts = (await reader.readline()).decode("latin-1").split()
        for _ in range(_MAX_HEADER_LINES):  # skip the headers
            if (await reader.readline()).strip() == b"":
                break
        plain = "text/plain; charset=utf-8"
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, "bad request\n", plain
        method, path = parts[0], parts[1].split("?", 1)[0]
        if path != "/metrics":
            return 404, f"no such path {path}\n", plain
        if method != "GET":
            return 405, f"method {method} not allowed\n", plain
        try:
            return 200, self.render(), CONTENT_TYPE
        except Exception as e:  # a metrics bug must not take the endpoint down
            return 500, f"cannot render metrics: {e!r}\n", plain
