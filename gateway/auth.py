"""The gateway's side of identity: the bearer token dependency every endpoint
but ``/healthz`` takes, and the refusals with their audit.

:mod:`gateway.access` decides; this module reads the header, raises
:class:`Refused`, and answers it: 401 (with ``WWW-Authenticate: Bearer``) or
403 or a hidden 404, in the gateway's error shape. Every refusal is logged
with the identity (``anonymous`` without a valid token), the endpoint and
the reason, and published as an ``error_record`` (code ``unauthorized`` or
``forbidden``) on ``hops.v1.errors``, which the monitor counts.

The dependency is FastAPI's :class:`~fastapi.security.HTTPBearer` (without
its own errors, which are not the gateway's shape), so that the OpenAPI
schema declares the scheme and which operations need it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway import access, views
from shared.tenants import Principal, TenantsFile

SCHEME = "bearer"
# The dashboard's cookie (gateway.ui): the token, HttpOnly and SameSite=Strict,
# so that a browser authenticates as a client does with its header.
COOKIE = "hops_token"
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name=SCHEME,
    description="A tenant's or an admin's token from the tenants file (`hops up` writes the "
    "admin's to `.hops/credentials/admin.token`).",
)


class Refused(Exception):
    """A request refused by :mod:`gateway.access`; answered by :func:`on_refused`."""

    def __init__(self, principal: Principal | None, denied: access.Denied) -> None:
        super().__init__(denied.reason)
        self.principal = principal
        self.denied = denied


def check(principal: Principal, denied: access.Denied | None) -> None:
    """Raise :class:`Refused` for ``denied``; nothing when it is None."""
    if denied is not None:
        raise Refused(principal, denied)


async def caller(
    request: Request,
    _scheme: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
) -> Principal:
    """Whom the request's bearer token acts for; :class:`Refused` (401) if nobody."""
    tenants: TenantsFile | None = request.app.state.tenants
    found = access.identify(tenants, authorization(request))
    if isinstance(found, access.Denied):
        raise Refused(None, found)
    return found


def authorization(request: Request) -> str | None:
    """The request's ``Authorization`` header, else the dashboard's cookie
    as a bearer header (the header wins: a client that sends both means it)."""
    header = request.headers.get("authorization")
    if header:
        return header
    token = request.cookies.get(COOKIE)
    return f"Bearer {token}" if token else None


Caller = Annotated[Principal, Depends(caller)]


async def on_refused(request: Request, exc: Exception) -> JSONResponse:
    """Audit a refusal (log and ``error_record``), then answer it."""
    if not isinstance(exc, Refused):  # registered for Refused only
        raise exc
    denied = exc.denied
    endpoint = f"{request.method} {request.url.path}"
    who = access.identity(exc.principal)
    bus = getattr(request.app.state, "bus", None)
    if bus is not None:  # the record's error names who, as the log line does
        await bus.reporter.refused(who, endpoint, f"{who}: {denied.reason}", denied.audit_code)
    headers = None
    if denied.status == 401:  # RFC 6750: how to authenticate, and whether a token failed
        invalid = ', error="invalid_token"' if authorization(request) else ""
        headers = {"WWW-Authenticate": f'Bearer realm="hops"{invalid}'}
    body = views.error_body(denied.code, denied.error)
    return JSONResponse(body, status_code=denied.status, headers=headers)


_REFUSALS: dict[str, dict[str, Any]] = {
    "401": {"description": "no bearer token, or one the tenants file does not know",
            "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
    "403": {"description": "the token's tenant may not do this",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
}


def document_refusals(schema: dict[str, Any]) -> None:
    """Add the 401 and 403 answers to every operation that needs a token."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if any(SCHEME in s for s in operation.get("security", ())):
                responses = operation.setdefault("responses", {})
                for status, answer in _REFUSALS.items():
                    responses.setdefault(status, answer)
