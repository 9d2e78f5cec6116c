"""The dashboard's pages: cluster, queue, jobs, one job, tenants. Each
answers the whole page, or with ``?part=1`` only its live part (what the
page fetches again when an event says it changed). Registered by
:func:`register`, which :func:`gateway.app.create_app` calls."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway import access, views
from gateway.ui import docs, render
from gateway.ui.hub import WAITING
from gateway.ui.routes import (
    event_routes,
    hub_of,
    job_dicts,
    job_page,
    json_records,
    label,
    login_routes,
    matches,
    offset_of,
    part_or_page,
    queue_rows,
    queue_view,
    to_login,
    who,
)
from shared.tenants import Principal

T = TypeVar("T")
Page = Callable[[Request, Principal], Coroutine[Any, Any, Response]]


def register(app: FastAPI) -> None:
    """Every route of the dashboard, and ``/docs`` served offline."""
    login_routes(app)
    event_routes(app)
    docs.docs_routes(app)
    for path, page in (("/ui/cluster", cluster), ("/ui/queue", queue), ("/ui/jobs", jobs),
                       ("/ui/tenants", tenants)):
        _page_route(app, path, page)

    @app.get("/ui/jobs/{job_id}", include_in_schema=False)
    async def one_job(request: Request, job_id: str) -> Response:
        principal = who(request)
        if principal is None:
            return to_login(request)
        return await job_page(request, principal, job_id)


def _page_route(app: FastAPI, path: str, page: Page) -> None:
    async def serve(request: Request) -> Response:
        principal = who(request)
        if principal is None:
            return to_login(request)
        return await page(request, principal)

    app.add_api_route(path, serve, methods=["GET"], include_in_schema=False)
    if path == "/ui/cluster":
        app.add_api_route("/ui", serve, methods=["GET"], include_in_schema=False)


async def cluster(request: Request, principal: Principal) -> Response:
    bus = request.app.state.bus
    view = views.cluster_view(await bus.nodes(), await bus.placements())
    if not principal.admin:
        own = {r.job_id for r in await bus.jobs() if r.spec.tenant == principal.tenant}
        view = access.redact_cluster(view, own)
    part = render.cluster_part(view, list(hub_of(request).samples), principal.admin)
    return part_or_page(request, principal, "Cluster", "cluster", part, on="cluster")


async def queue(request: Request, principal: Principal) -> Response:
    bus = request.app.state.bus
    view = await queue_view(request, principal)
    if isinstance(view, str):
        part = f"<p class=err>The queue cannot be read: {render.e(view)}</p>"
        return part_or_page(request, principal, "Queue", "queue", part, on="job explain")
    by_key = json_records(await bus.jobs())
    rows = queue_rows(view, by_key, principal)
    want = {k: request.query_params.get(k, "") for k in ("tenant", "phase", "reason")}
    kept = [(q, j) for q, j in rows if all(not v or v == got for v, got in (
        (want["tenant"], (j or {}).get("spec", {}).get("tenant")), (want["phase"], q["phase"]),
        (want["reason"], (q.get("why") or {}).get("code"))))]
    choices = {"tenant": [(j or {}).get("spec", {}).get("tenant", "") for _, j in rows],
               "phase": [q["phase"] for q, _ in rows],
               "reason": [(q.get("why") or {}).get("code", "") for q, _ in rows]}
    return _paged(request, principal, ("Queue", "queue", "job explain"), render.QUEUE_HEAD,
                  kept, lambda qj: render.queue_row(*qj, principal.admin),
                  render.filters(choices, want))


async def jobs(request: Request, principal: Principal) -> Response:
    bus = request.app.state.bus
    rows = job_dicts(request, principal, await bus.jobs(), await bus.explains())
    want = {k: request.query_params.get(k, "") for k in ("tenant", "phase", "reason")}
    one = request.query_params.get("id")
    kept = [r for r in rows if matches(r, want) and (not one or one in (r["key"], r["job_id"]))]
    choices = {"tenant": [r["spec"]["tenant"] for r in rows], "phase": list(views.PHASES),
               "reason": [(r.get("why") or {}).get("code", "") for r in rows]}
    return _paged(request, principal, ("Jobs", "jobs", "rows"), render.JOBS_HEAD,
                  kept, lambda r: render.job_row(r, principal.admin),
                  render.filters(choices, want), rows_only=bool(one))


def _paged(request: Request, principal: Principal, page: tuple[str, str, str],
           head: Sequence[str], kept: Sequence[T], row: Callable[[T], str], filters: str,
           *, rows_only: bool = False) -> Response:
    """A table page of the ``kept`` rows, each drawn by ``row``,
    ``render.PAGE_ROWS`` at a time: a later page (``?offset=``), or
    ``rows_only``, answers its rows alone, to be appended where the table
    is; the first, the table, the "more" link
    and the filters. ``page`` is (title, slug, the events it refreshes on)."""
    start = offset_of(request)
    shown = kept[start:start + render.PAGE_ROWS]
    body = "".join(row(r) for r in shown)
    if start or rows_only:
        return Response(body, media_type="text/html")
    part = (render.table(head, [body])
            + render.more(len(shown), len(kept), f"?{request.url.query}"))
    title, slug, on = page
    return part_or_page(request, principal, title, slug, part, filters, on=on)


async def tenants(request: Request, principal: Principal) -> Response:
    bus = request.app.state.bus
    scope = None if principal.admin else principal.tenant
    records = access.tenants_body(await bus.tenant_records(), scope,
                                  by_id=not principal.admin)["tenants"]
    waiting: dict[str, int] = {}
    for r in await bus.jobs():
        if r.phase in WAITING and (scope is None or r.spec.tenant == scope):
            waiting[r.spec.tenant] = waiting.get(r.spec.tenant, 0) + 1
    part = render.tenants_part(records, waiting)
    return part_or_page(request, principal, "Tenants", "tenants", part, on="cluster")


__all__ = ["label", "register"]
