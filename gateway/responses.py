"""The gateway's response helpers, shared by its route modules
(:mod:`gateway.app`, :mod:`gateway.cluster_routes`): the JSON answer (a 503
with ``Retry-After``), the error shape of :func:`gateway.views.error_body`,
upstream failures and ids that cannot name anything on the bus."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from gateway import views
from gateway.bus import GatewayBus, Unavailable
from shared.subjects import SubjectError, check_token

# The 503 every route that asks a service over NATS may answer (OpenAPI).
ERRORS: dict[int | str, dict[str, Any]] = {
    503: {
        "description": "no scheduler answered (restarting, failing over, or NATS "
        "reconnecting): retry after the `Retry-After` seconds",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    },
}


def bus_of(request: Request) -> GatewayBus:
    """The app's NATS connection (opened in its lifespan)."""
    bus: GatewayBus = request.app.state.bus
    return bus


def respond(status: int, body: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    """``body`` as JSON with ``status``; a 503 says when to try again."""
    if status == 503:  # transient: say when to try again
        headers = {**(headers or {}), "Retry-After": str(views.RETRY_AFTER_S)}
    return JSONResponse(body, status_code=status, headers=headers)


def failure(status: int, code: str, error: str) -> JSONResponse:
    """The error shape: ``{ok: false, code, error}``."""
    return respond(status, views.error_body(code, error))


def upstream_failure(e: Exception) -> JSONResponse:
    """503 when no service answered in time, 502 for an answer that makes no sense."""
    if isinstance(e, Unavailable):
        return failure(503, views.UNAVAILABLE, str(e))
    return failure(502, views.BAD_GATEWAY, str(e))


def not_a_token(value: str, what: str) -> JSONResponse | None:
    """404 for an id that cannot name anything on the bus (a subject token)."""
    try:
        check_token(value, what)
    except SubjectError as e:
        return failure(404, views.NOT_FOUND, str(e))
    return None
