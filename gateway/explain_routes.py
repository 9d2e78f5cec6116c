"""The gateway's one-job lookups and what it tells of why a job waits:
``GET /jobs/{id}``'s reason, receipt, forecast and conditions, and ``GET
/jobs/{id}/timeline`` (the shell; the views are :mod:`gateway.explain_view`'s,
the conditions :mod:`gateway.conditions`'). Registered by
:func:`gateway.app.create_app`; docs/explain.md, "Where to look"."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from gateway import access, views
from gateway.auth import Caller, Refused
from gateway.bus import GatewayBus
from gateway.explain_view import ADMIN, Viewer, explain_fields, timeline_view
from gateway.openapi import json_response
from gateway.responses import bus_of, failure, respond
from shared.explain import JobExplain
from shared.jobkeys import candidates, local_id, split_key
from shared.records import JobRecord
from shared.tenants import Principal

# ``?tenant=`` of the one-job endpoints.
TenantParam = Annotated[str | None, Query(
    description="the job's tenant, for an admin (default: `default`); a tenant's token "
                "names its own jobs and may leave it out (another tenant: 403)")]
# The refusals of the one-job reads (OpenAPI).
ONE_JOB_REFUSALS: dict[int | str, dict[str, Any]] = {
    403: {"description": "a tenant naming another tenant"},
    404: {"description": "no such job"},
}
# Entries ``GET /jobs/{id}/timeline`` answers at most (the stream keeps 256 per job).
TIMELINE_LIMIT = 256
TIMELINE_MAX = 1000


async def visible_job(request: Request, principal: Principal, job_id: str,
                      requested: str | None) -> tuple[str, JobRecord | None]:
    """The key and record of the job a request names by ``job_id`` and
    ``?tenant=`` (``requested``); the record is None when there is no such
    job of that tenant. :class:`Refused` for a tenant naming another tenant
    (403), and for a record of another tenant under the key (only one
    written before keys were qualified can be): a 404 like a missing job,
    audited."""
    tenant = access.job_tenant(principal, requested)
    if isinstance(tenant, access.Denied):
        raise Refused(principal, tenant)
    tried = candidates(tenant, job_id) if split_key(job_id)[0] is None else ()
    for key in tried:
        record = await bus_of(request).job(key)
        if record is not None and record.spec.tenant == tenant:
            return key, record
        if record is not None and key == tried[0] and not principal.admin:
            raise Refused(principal, access.hidden(principal, job_id, record.spec.tenant))
    return (tried[0] if tried else job_id), None


async def viewer_of(bus: GatewayBus, principal: Principal, named: Iterable[str]) -> Viewer:
    """Who ``principal`` is as a viewer of the jobs ``named``: the tenants
    of the bare keys among them come from their records (a bare key may be
    a record of another tenant written before keys were qualified)."""
    if principal.admin or principal.tenant is None:
        return ADMIN
    tenants: dict[str, str] = {}
    for key in set(named):
        if split_key(key)[0] is None:
            record = await bus.job(key)
            if record is not None:
                tenants[key] = record.spec.tenant
    return Viewer(tenant=principal.tenant, tenants=tenants)


def _named(explain: JobExplain | None) -> list[str]:
    """The jobs an explain entry names (its reason's and its receipt's)."""
    if explain is None:
        return []
    return [*(explain.why.jobs if explain.why else ()),
            *(explain.receipt.takers if explain.receipt else ())]


def iso(epoch: float) -> str | None:
    """``epoch`` as ISO 8601 in UTC (None for 0: not known)."""
    if epoch <= 0:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat()


async def job_body(request: Request, principal: Principal, key: str, record: JobRecord,
                   now: float) -> dict[str, Any]:
    """``GET /jobs/{id}``: the record (:func:`gateway.views.job_view`)
    with the leader's word on it (:func:`gateway.explain_view.explain_fields`),
    each condition's ``since`` also in ISO 8601 (``since_time``)."""
    bus = bus_of(request)
    explain = await bus.explain(key)
    viewer = await viewer_of(bus, principal, _named(explain))
    body = views.job_view(record, now)
    body.update(explain_fields(record, explain, viewer))
    for condition in body["conditions"]:
        condition["since_time"] = iso(condition["since"])
    return body


def timeline_routes(app: FastAPI) -> None:
    @app.get("/jobs/{job_id}/timeline", summary="One job's history, oldest first",
             description="Submitted, profiled, each plan's reason as it changed, starts, "
             "stops with their receipts, forecasts as they moved, the end (stream "
             "`HOPS_TIMELINE`); kept after the job ends. A tenant sees other tenants' "
             "jobs as \"another tenant's job\".",
             responses={200: json_response("The timeline", "Timeline"), **ONE_JOB_REFUSALS})
    async def timeline(request: Request, job_id: str, principal: Caller,
                       tenant: TenantParam = None,
                       limit: Annotated[int, Query(ge=1, le=TIMELINE_MAX,
                                                   description="entries at most")] = TIMELINE_LIMIT,
                       ) -> JSONResponse:
        key, record = await visible_job(request, principal, job_id, tenant)
        if record is None:
            return failure(404, views.NOT_FOUND, f"no job {job_id!r}")
        bus = bus_of(request)
        entries, more = await bus.timeline(key, limit)
        named = [j for e in entries for j in (*(e.why.jobs if e.why else ()),
                                              *(e.receipt.takers if e.receipt else ()))]
        viewer = await viewer_of(bus, principal, named)
        shown = timeline_view(entries, viewer)
        return respond(200, {"job_id": local_id(key), "tenant": record.spec.tenant,
                             "entries": shown, "count": len(shown), "truncated": more})
