"""A tiny HTTP health endpoint on ``asyncio.start_server`` (no dependency).

``GET /healthz`` answers ``200 {"service": ..., "ok": true, "nats": "connected"}``
while the NATS connection is up and ``503`` with ``"ok": false`` otherwise;
anything else is ``404`` (``405`` for another method on ``/healthz``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
_READ_TIMEOUT_S = 5.0
_MAX_HEADER_LINES = 100


class HealthServer:
    """Serves ``/healthz`` for ``service``; ``nats_status()`` says the state of
    the connection (``connected`` means healthy) and ``details()`` adds
    fields to the body."""

    def __init__(
        self,
        service: str,
        nats_status: Callable[[], str],
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        details: Callable[[], Mapping[str, object]] | None = None,
    ) -> None:
        self.service = service
        self.nats_status = nats_status
        self.host = host
        self.port = port
        self.details = details
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

    def status(self) -> tuple[int, dict[str, object]]:
        nats = self.nats_status()
        body: dict[str, object] = {"service": self.service, "ok": nats == "connected"}
        body["nats"] = nats
        if self.details is not None:
            body.update(self.details())
        return (200 if body["ok"] else 503), body

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            code, body = await asyncio.wait_for(self._route(reader), _READ_TIMEOUT_S)
            payload = json.dumps(body).encode()
            head = (
                f"HTTP/1.1 {code} {_REASONS[code]}\r\n"
                "Content-Type: application/json\r\n"
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

    async def _route(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
        parts = (await reader.readline()).decode("latin-1").split()
        for _ in range(_MAX_HEADER_LINES):  # skip the headers
            if (await reader.readline()).strip() == b"":
                break
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, {"error": "bad request"}
        method, path = parts[0], parts[1].split("?", 1)[0]
        if path != "/healthz":
            return 404, {"error": f"no such path {path}"}
        if method != "GET":
            return 405, {"error": f"method {method} not allowed"}
        return self.status()
