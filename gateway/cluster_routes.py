"""The gateway's operator and cluster routes: the queue, ``/cluster``,
``/healthz``, node removal, drain and undrain (admins only, over the
monitor's ``hops.v1.nodes.remove`` and ``hops.v1.nodes.drain``) and the
tenants' views. Registered by :func:`gateway.app.create_app`; the table
of every endpoint is :mod:`gateway.app`'s docstring."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from gateway import access, views
from gateway.auth import Caller, Refused, check
from gateway.bus import BadUpstream, GatewayBus, Unavailable
from gateway.explain_view import ADMIN, Viewer, queue_body
from gateway.responses import ERRORS, bus_of, failure, not_a_token, respond, upstream_failure
from services.runtime.bus import nats_status
from shared.events import INVALID
from shared.tenants import Principal, TenantsFile


def cluster_routes(app: FastAPI) -> None:
    @app.get("/queue", summary="The waiting jobs in priority order",
             description="Each with its priority, latency ratio, reason (`why`), position "
             "(overall and in its tenant) and forecast; a tenant sees only its own jobs.",
             responses=ERRORS)
    async def queue(request: Request, principal: Caller) -> JSONResponse:
        try:
            view = await bus_of(request).queue()
        except (Unavailable, BadUpstream) as e:
            return upstream_failure(e)
        if not view.ok:
            return failure(503, views.UNAVAILABLE, view.error or "the scheduler cannot answer")
        if principal.admin:
            return respond(200, queue_body(view, ADMIN))
        records = await bus_of(request).jobs()
        viewer = Viewer(tenant=principal.tenant,
                        tenants={r.job_id: r.spec.tenant for r in records})
        own = {r.job_id for r in records if r.spec.tenant == principal.tenant}
        return respond(200, queue_body(view, viewer, only=own))

    @app.get("/cluster", summary="Servers, their GPUs and the jobs holding them",
             description="A tenant sees other tenants' jobs as `(another tenant)`.")
    async def cluster(request: Request, principal: Caller) -> JSONResponse:
        bus = bus_of(request)
        nodes = await bus.nodes()
        placements = await bus.placements()
        view = views.cluster_view(nodes, placements)
        if not principal.admin:
            view = access.redact_cluster(view, await _own_jobs(request, principal))
        return respond(200, view)

    @app.get("/healthz", summary="Health: 200 while connected to NATS")
    async def healthz(request: Request) -> JSONResponse:
        bus: GatewayBus | None = getattr(request.app.state, "bus", None)
        status = nats_status(bus.nc) if bus is not None else "disconnected"
        ok = status == "connected"
        body = {"service": "gateway", "ok": ok, "nats": status}
        return respond(200 if ok else 503, body)


_REMOVE_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such node"},
    409: {"description": "the node is alive and force is not set"},
    **ERRORS,
}


def node_routes(app: FastAPI) -> None:
    summary = "Remove a node (an alive one only with force=true; its jobs are requeued)"

    @app.delete("/nodes/{server_id}", summary=summary, responses=_REMOVE_RESPONSES,
                description="For admins only.")
    async def remove_node(request: Request, server_id: str, principal: Caller,
                          force: bool = False, reason: str = "") -> JSONResponse:
        check(principal, access.admin_only(principal, "removing a node"))
        bus = bus_of(request)
        bad = not_a_token(server_id, "server id")
        if bad is not None:
            return bad
        try:
            reply = await bus.remove_node(server_id, force, reason)
        except (Unavailable, BadUpstream) as e:
            return upstream_failure(e)
        bus.log.info("node removal answered", server_id=server_id, force=force, ok=reply.ok,
                     code=reply.code)
        return respond(views.reply_status(reply), views.node_reply_body(reply))

    for verb, drain in (("drain", True), ("undrain", False)):
        _drain_route(app, verb, drain)


class DrainBody(BaseModel):
    """``POST /nodes/{id}/drain``'s body (optional): ``move`` stops the
    node's running jobs with a checkpoint at the next round and plans them
    elsewhere; without it they finish where they are."""

    model_config = ConfigDict(extra="forbid")
    move: bool = False
    reason: str = ""


def _drain_route(app: FastAPI, verb: str, drain: bool) -> None:
    what = ("Drain a node: no new work goes there; its running jobs finish there, or with "
            "`move` are moved at the next round" if drain else
            "Undrain a node: it is available again at the next plan")

    @app.post(f"/nodes/{{server_id}}/{verb}", summary=what, description="For admins only.",
              responses={404: {"description": "no such node"}, **ERRORS})
    async def drain_node(request: Request, server_id: str, principal: Caller,
                         body: DrainBody | None = None) -> JSONResponse:
        check(principal, access.admin_only(principal, f"{verb}ing a node"))
        asked = body or DrainBody()
        if not drain and asked.move:
            bus_of(request).log.info("node undrain refused: move given", server_id=server_id)
            return failure(400, INVALID, "move is for drain, not undrain")
        bad = not_a_token(server_id, "server id")
        if bad is not None:
            return bad
        bus = bus_of(request)
        try:
            reply = await bus.drain_node(server_id, drain, asked.move, asked.reason)
        except (Unavailable, BadUpstream) as e:
            return upstream_failure(e)
        bus.log.info(f"node {verb} answered", server_id=server_id, move=asked.move,
                     ok=reply.ok, code=reply.code)
        return respond(views.reply_status(reply), views.node_reply_body(reply))


def tenant_routes(app: FastAPI) -> None:
    @app.get("/tenants", summary="Tenants' virtual clusters, their cells and bound servers",
             description="HiveD's VC view per tenant, as the scheduler leader last wrote it; "
             "an admin sees every tenant (or `tenant`), a tenant only its own.",
             responses={403: {"description": "another tenant's view"},
                        404: {"description": "the cluster has no cells"}})
    async def tenants(request: Request, principal: Caller, tenant: Annotated[
            str | None, Query(description="only this tenant")] = None) -> JSONResponse:
        scope = access.tenants_scope(principal, tenant)
        if isinstance(scope, access.Denied):
            raise Refused(principal, scope)
        file: TenantsFile | None = request.app.state.tenants
        if file is not None and file.cells is None:
            return failure(404, access.NOT_FOUND, "this cluster has no cells: the tenants file "
                            "has no cells section (docs/tenancy.md)")
        records = await bus_of(request).tenant_records()
        return respond(200, access.tenants_body(records, scope, by_id=not principal.admin))


async def _own_jobs(request: Request, principal: Principal) -> set[str]:
    """The ids of ``principal``'s tenant's jobs."""
    return {r.job_id for r in await bus_of(request).jobs() if r.spec.tenant == principal.tenant}
