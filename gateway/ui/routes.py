"""The dashboard's routes (read-only): log in and out, the pages, their
parts (what a page fetches again when an event says it changed) and the
event stream. Each page reads what the API's endpoint of the same name
reads, through the same functions, so a tenant sees here exactly what its
token shows through the API (gateway/access.py); docs/dashboard.md."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from gateway import access, views
from gateway.auth import COOKIE, authorization
from gateway.explain_routes import job_body, visible_job
from gateway.explain_view import ADMIN, Viewer, list_fields, queue_body, timeline_view
from gateway.ui import render
from gateway.ui.hub import Hub
from shared.jobkeys import local_id
from shared.tenants import Principal

STATIC = Path(__file__).parent / "static"
# How often an idle event stream says it is alive (proxies close silent ones).
KEEPALIVE_S = 15.0
_LOGIN_BODY_MAX = 4096


def who(request: Request) -> Principal | None:
    """Whom the request's cookie (or header) acts for; None: nobody."""
    found = access.identify(request.app.state.tenants, authorization(request))
    return None if isinstance(found, access.Denied) else found


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/login?next={quote(target, safe='')}", status_code=303)


def safe_next(target: str) -> str:
    """Where to go after logging in: a path of this gateway, never another site."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/ui/cluster"
    return target


def html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def login_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/cluster", status_code=303)

    @app.get("/ui/login", include_in_schema=False)
    async def login_form(next: str = "/ui/cluster") -> HTMLResponse:
        return html(render.login_page(next_url=safe_next(next)))

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        raw = (await request.body())[:_LOGIN_BODY_MAX].decode("utf-8", "replace")
        form = {k: v[0] for k, v in parse_qs(raw).items()}
        token, target = form.get("token", "").strip(), safe_next(form.get("next", ""))
        found = access.identify(request.app.state.tenants, f"Bearer {token}")
        if isinstance(found, access.Denied) or not token:
            error = found.error if isinstance(found, access.Denied) else "give a token"
            return html(render.login_page(error, target), 401)
        out = RedirectResponse(target, status_code=303)
        out.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                       secure=request.url.scheme == "https")
        return out

    @app.get("/ui/logout", include_in_schema=False)
    async def logout() -> RedirectResponse:
        out = RedirectResponse("/ui/login", status_code=303)
        out.delete_cookie(COOKIE, path="/")
        return out

    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")


def hub_of(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def event_routes(app: FastAPI) -> None:
    @app.get("/ui/events", include_in_schema=False)
    async def events(request: Request) -> Response:
        principal = who(request)
        if principal is None:
            return Response("log in first\n", status_code=401, media_type="text/plain")
        hub = hub_of(request)
        page = hub.open(principal)

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 2000\n\n"
                while not await request.is_disconnected():
                    try:
                        event = await asyncio.wait_for(page.queue.get(), KEEPALIVE_S)
                    except TimeoutError:
                        yield b": alive\n\n"
                        continue
                    yield f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
            finally:
                hub.close(page)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})


def viewer_for(principal: Principal, records: list[Any]) -> Viewer:
    if principal.admin:
        return ADMIN
    return Viewer(tenant=principal.tenant, tenants={r.job_id: r.spec.tenant for r in records})


def shown_jobs(principal: Principal, records: list[Any]) -> list[Any]:
    return [r for r in records if principal.admin or r.spec.tenant == principal.tenant]


def job_dicts(request: Request, principal: Principal, records: list[Any],
              explains: dict[str, Any]) -> list[dict[str, Any]]:
    """The jobs ``principal`` sees as ``GET /jobs`` lists them, newest first,
    each with its key (admins' rows are named by it)."""
    viewer = viewer_for(principal, records)
    now = time.time()
    out = []
    for r in sorted(shown_jobs(principal, records), key=lambda r: (-r.submitted_at, r.job_id)):
        body = views.job_view(r, now)
        body.update(list_fields(explains.get(r.job_id), viewer), key=r.job_id)
        body["job_id"] = local_id(r.job_id)
        out.append(body)
    return out


def chosen(request: Request, *names: str) -> dict[str, str]:
    return {n: request.query_params.get(n, "") for n in names}


def matches(row: dict[str, Any], want: dict[str, str]) -> bool:
    why = (row.get("why") or {}).get("code", "")
    return all(not v or v == {"tenant": row["spec"]["tenant"], "phase": row["phase"],
                              "reason": why}.get(k) for k, v in want.items())


def offset_of(request: Request) -> int:
    raw = request.query_params.get("offset", "0")
    return int(raw) if raw.isdigit() else 0


def label(principal: Principal) -> str:
    return access.identity(principal)


async def job_page(request: Request, principal: Principal, job_id: str) -> Response:
    tenant = request.query_params.get("tenant")
    try:
        key, record = await visible_job(request, principal, job_id, tenant)
    except Exception:  # a tenant naming another tenant: as a missing job
        record = None
        key = job_id
    if record is None:
        return html(render.shell("No such job", "jobs", label(principal),
                                 f"<p>No job {render.e(job_id)}.</p>"), 404)
    bus = request.app.state.bus
    body = await job_body(request, principal, key, record, time.time())
    entries, _ = await bus.timeline(key, 256)
    viewer = Viewer(tenant=principal.tenant) if not principal.admin else ADMIN
    part = render.job_part(body, timeline_view(entries, viewer))
    if request.query_params.get("part"):
        return html(part)
    suffix = f"?tenant={quote(tenant)}" if tenant else ""
    logs = f"/jobs/{quote(job_id)}/logs{suffix}{'&' if suffix else '?'}follow=true&tail=200"
    on = f"job:{key if principal.admin else local_id(key)}"
    return html(render.shell(f"Job {job_id}", "jobs", label(principal),
                             render.job_page_body(body, part, logs), on))


def queue_rows(view: dict[str, Any], by_key: dict[str, dict[str, Any]],
               principal: Principal) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    out = []
    for q in view["entries"]:
        key = q["job_id"] if principal.admin else f"{principal.tenant}/{q['job_id']}"
        job = by_key.get(key) or by_key.get(q["job_id"])
        out.append((q, job))
    return out


def json_records(records: list[Any]) -> dict[str, dict[str, Any]]:
    return {r.job_id: views.jsonable(r) for r in records}


async def queue_view(request: Request, principal: Principal) -> dict[str, Any] | str:
    """``GET /queue``'s body for ``principal``, or why there is none."""
    bus = request.app.state.bus
    try:
        view = await bus.queue()
    except Exception as e:  # Unavailable, BadUpstream: the page says so
        return str(e)
    if not view.ok:
        return view.error or "the scheduler cannot answer"
    if principal.admin:
        return queue_body(view, ADMIN)
    records = await bus.jobs()
    own = {r.job_id for r in records if r.spec.tenant == principal.tenant}
    return queue_body(view, viewer_for(principal, records), only=own)


def page_json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


def part_or_page(request: Request, principal: Principal, title: str, page: str, part: str,
                 head: str = "", on: str = "") -> HTMLResponse:
    if request.query_params.get("part"):
        return html(part)
    live = f'{head}<div id=live data-part="?part=1&{request.url.query}">{part}</div>'
    return html(render.shell(title, page, label(principal), live, on))
