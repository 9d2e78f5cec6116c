"""A tiny HTTP health endpoint on the runtime's tiny HTTP server (no dependency).

``GET /healthz`` answers ``200 {"service": ..., "ok": true, "nats": "connected"}``
while the NATS connection is up and ``503`` with ``"ok": false`` otherwise;
anything else is ``404`` (``405`` for another method on ``/healthz``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from services.runtime.httpd import Response, TinyHttpServer


class HealthServer:
    """Serves ``/healthz`` for ``service``; ``nats_status()`` says the state of
    the connection (``connected`` means healthy) and ``details()`` adds
    fields to the body."""

    def __init__(
        self,
        service: str,
        nats_status: Callable[[], str],
        *,
        host: str,
        port: int = 0,
        details: Callable[[], Mapping[str, object]] | None = None,
    ) -> None:
        self.service = service
        self.nats_status = nats_status
        self.host = host
        self.port = port
        self.details = details
        bad = (400, json.dumps({"error": "bad request"}).encode(), "application/json")
        self._http = TinyHttpServer(self._handle, host=host, port=port, bad_request=bad)

    async def start(self) -> int:
        """Listen; return the bound port (an ephemeral one when ``port`` is 0)."""
        self.port = await self._http.start()
        return self.port

    async def stop(self) -> None:
        await self._http.stop()

    def status(self) -> tuple[int, dict[str, object]]:
        nats = self.nats_status()
        body: dict[str, object] = {"service": self.service, "ok": nats == "connected"}
        body["nats"] = nats
        if self.details is not None:
            body.update(self.details())
        return (200 if body["ok"] else 503), body

    def _handle(self, method: str, path: str) -> Response:
        body: dict[str, object]
        if path != "/healthz":
            code, body = 404, {"error": f"no such path {path}"}
        elif method != "GET":
            code, body = 405, {"error": f"method {method} not allowed"}
        else:
            code, body = self.status()
        return code, json.dumps(body).encode(), "application/json"
