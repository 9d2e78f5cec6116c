"""Reloading the tenants file without a restart: ``POST /tenants/reload``
(admins only; ``hops tenants reload``) and SIGHUP to the gateway.

The gateway reads the file again for its tokens, exactly as at start
(:func:`shared.tenants.read_tenants`): a file that does not pass is
refused, logged, and the old one stays. The request then asks every
scheduler replica to reload (``hops.v1.reload.tenants``,
:mod:`services.scheduler.reload`) and answers each process's answer.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import State

from gateway import access
from gateway.auth import Caller, check
from gateway.responses import ERRORS, bus_of, respond
from shared.events import INVALID, TenantsReloaded
from shared.tenants import TenantsError, TenantsFile, read_tenants

# No scheduler replica answered the reload: nothing reloaded them (HTTP 503).
UNAVAILABLE = "unavailable"


def reload_gateway(state: State, log: Any) -> TenantsReloaded:
    """Read the gateway's tenants file again and use it, or keep the old one."""
    path: str = state.settings.tenants
    old: TenantsFile | None = state.tenants
    replica = f"{socket.gethostname()}-{os.getpid()}"
    kept = tuple(sorted(old.tenants)) if old is not None else ()
    try:
        if not path:
            raise TenantsError("the gateway runs without a tenants file (--insecure): there is "
                               "nothing to reload; restart it with HOPS_TENANTS")
        file = read_tenants(path)
    except TenantsError as e:
        log.error("tenants file refused; the old one stays", source=path, error=str(e))
        return TenantsReloaded(ok=False, service="gateway", replica=replica, source=path,
                               tenants=kept, error=str(e), code=INVALID)
    state.tenants = file
    log.info("tenants file reloaded", source=path, tenants=sorted(file.tenants))
    return TenantsReloaded(ok=True, service="gateway", replica=replica, source=path,
                           tenants=tuple(sorted(file.tenants)))


def reload_body(answers: list[TenantsReloaded]) -> tuple[int, dict[str, Any]]:
    """The status and body of ``POST /tenants/reload``: 200 when every
    process reloaded, 422 ``invalid`` when one refused the file, 503 when no
    scheduler replica answered."""
    body: dict[str, Any] = {"ok": True, "answers": msgspec.to_builtins(answers)}
    refused = [a for a in answers if not a.ok]
    if refused:
        first = refused[0]
        return 422, {**body, "ok": False, "code": first.code,
                     "error": f"{first.service} {first.replica}: {first.error}"}
    if not any(a.service == "scheduler" for a in answers):
        return 503, {**body, "ok": False, "code": UNAVAILABLE,
                     "error": "no scheduler replica answered the reload: is the scheduler "
                              "running? (the gateway reloaded its own file)"}
    return 200, body


def reload_routes(app: FastAPI) -> None:
    @app.post("/tenants/reload", summary="Reload the tenants file without a restart",
              description="For admins only. The gateway and every scheduler replica read "
              "HOPS_TENANTS again and check it as at start; a file that does not pass is "
              "refused by that process, which keeps the old one (docs/tenancy.md).",
              responses={422: {"description": "a process refused the file"},
                         503: {"description": "no scheduler replica answered"}, **ERRORS})
    async def reload(request: Request, principal: Caller) -> JSONResponse:
        check(principal, access.admin_only(principal, "reloading the tenants file"))
        bus = bus_of(request)
        answers = [reload_gateway(request.app.state, bus.log), *await bus.reload_tenants()]
        status, body = reload_body(answers)
        bus.log.info("tenants reload answered", ok=body["ok"], answers=len(answers))
        return respond(status, body)
