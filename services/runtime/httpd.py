"""A tiny HTTP/1.1 server on ``asyncio.start_server`` (no dependency) for the
services' own endpoints: health (``services.runtime.health``; the monitor's
metrics are prometheus-client's server). One request per connection; the request
line is parsed, the headers skipped, and ``handle(method, path)`` answers
with a status, a body and its content type. A request line that is not
HTTP gets ``bad_request`` (a 400 in the endpoint's own content type).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable

Response = tuple[int, bytes, str]
# A handler answers at once, or awaits what it reads (the metrics read KV).
Handler = Callable[[str, str], Response | Awaitable[Response]]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_READ_TIMEOUT_S = 5.0
_MAX_HEADER_LINES = 100
PLAIN = "text/plain; charset=utf-8"


class TinyHttpServer:
    """Serves ``handle`` on ``host:port`` (port 0: an ephemeral one)."""

    def __init__(self, handle: Handler, *, host: str, port: int = 0,
                 bad_request: Response = (400, b"bad request\n", PLAIN)) -> None:
        self.handle = handle
        self.bad_request = bad_request
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; return the bound port."""
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
            head = (
                f"HTTP/1.1 {code} {_REASONS.get(code, 'Status')}\r\n"
                f"Content-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _route(self, reader: asyncio.StreamReader) -> Response:
        parts = (await reader.readline()).decode("latin-1").split()
        for _ in range(_MAX_HEADER_LINES):  # skip the headers
            if (await reader.readline()).strip() == b"":
                break
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self.bad_request
        answer = self.handle(parts[0], parts[1].split("?", 1)[0])
        return await answer if inspect.isawaitable(answer) else answer
