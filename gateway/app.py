"""The HTTP gateway: a FastAPI app over the NATS subjects of docs/events.md.

===========================  ============================================  =====================
endpoint                     does                                          answers
===========================  ============================================  =====================
``POST /jobs``               forwards the body, as it came, to             201 ``{job_id}``;
                             ``hops.v1.jobs.submit`` (a JobSpec or a       400/422/409/413/503
                             ``submit_job``)
``GET /jobs``                a page of ``hops_jobs`` records, oldest       200 ``{jobs, count,
                             first; ``phase``, ``tenant``, ``limit``       total, next_cursor}``;
                             (100, at most 1000), ``cursor``               400
``GET /jobs/{id}``           one record (``?tenant=T``: an admin names     200, 403, 404
                             the tenant, access.job_tenant), with its
                             reason, receipt, forecast and conditions
                             (:mod:`gateway.explain_routes`)
``GET /jobs/{id}/timeline``  the job's history (stream HOPS_TIMELINE)     200, 403, 404
``GET /jobs/{id}/logs``      its output, NDJSON (stream HOPS_LOGS;         200, 400, 403, 404
                             ``follow``: :mod:`gateway.log_routes`)
``GET /jobs/{id}/params``    a task job's final parameters, bytes          200, 403, 404, 409
                             (``hops_aggregator``: :mod:`gateway.params_routes`)
``DELETE /jobs/{id}``        ``cancel_job`` on ``hops.v1.jobs.cancel``     200, 403/404/409, 503
``POST /jobs/{id}/hold``     ``hold_job`` on ``hops.v1.jobs.hold``         200, 403/404/409, 503
``POST /jobs/{id}/release``  ``hold_job`` (``hold`` false), the same       200, 403/404/409, 503
``GET /queue``               the scheduler leader's ``QueueView``          200, 503
``GET /cluster``             ``hops_nodes`` servers, their GPUs and the    200
                             jobs holding them (``hops_alloc``)
``GET /tenants``             the tenants' virtual clusters, their cells    200, 403, 404
                             and bound servers (``hops_tenants``)
``POST /tenants/reload``      reload the tenants file (admins;              200, 403, 422, 503
                             :mod:`gateway.reload`)
``DELETE /nodes/{id}``       ``remove_node`` on ``hops.v1.nodes.remove``   200, 404, 409, 503
                             (``?force=true`` for an alive node)
``POST /nodes/{id}/drain``   ``drain_node`` on ``hops.v1.nodes.drain``     200, 400, 404, 503
                             (body ``{"move": bool, "reason": str}``,
                             optional): no new work there;
                             ``/nodes/{id}/undrain``: ``drain`` false
``GET /healthz``             whether the NATS connection is up             200, 503
``GET /docs``                the OpenAPI (Swagger) page, its assets served
                             here (no CDN: :mod:`gateway.ui.docs`)
``GET /``, ``/ui/...``       the dashboard (:mod:`gateway.ui`; a cookie
                             from ``/ui/login`` or the bearer header)
===========================  ============================================  =====================

Every endpoint but ``/healthz`` needs ``Authorization: Bearer <token>`` (or
the dashboard's cookie, which holds the same token), a token of the
tenants file (:mod:`gateway.access`, :mod:`gateway.auth`):
401 without one; a tenant submits only for itself (403 for a body naming
another tenant; without one, the job is the caller's), sees, cancels and
holds only its own jobs, named by their bare ids (each tenant's ids are its
own: two tenants may use one id, :mod:`shared.jobkeys`; a job not its own
answers 404 as a missing one; ``?tenant=`` naming another tenant, 403) and
removes or drains no node (403);
admins do
everything. The scheduler's admission refuses, 403, a ``command`` from a
tenant that may not run commands.

Every 503 carries ``Retry-After`` (:data:`gateway.views.RETRY_AFTER_S`):
nothing answered in time, which passes (a scheduler replica restarting or
failing over, NATS reconnecting).

Submissions are forwarded byte for byte so that the HTTP path validates
exactly as the NATS path does; :func:`gateway.views.reply_status` maps a
reply's code to the status. Bodies above ``MAX_PAYLOAD`` are refused with
413 before they reach NATS (and reported as an ``error_record``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated

import msgspec
import nats.errors
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import access, cluster_routes, pages, views
from gateway.auth import Caller, Refused, on_refused
from gateway.bus import BadUpstream, GatewayBus, Unavailable
from gateway.explain_routes import (
    ONE_JOB_REFUSALS,
    TenantParam,
    job_body,
    timeline_routes,
    visible_job,
)
from gateway.explain_view import ADMIN, Viewer, list_fields
from gateway.log_routes import log_routes
from gateway.openapi import json_response, openapi, submit_body_schema
from gateway.params_routes import params_routes
from gateway.reload import reload_routes
from gateway.responses import ERRORS, bus_of, failure, respond, upstream_failure
from gateway.settings import GatewaySettings
from gateway.signatures import signature_routes
from gateway.ui.hub import Hub
from gateway.ui.pages import register as ui_routes
from services.runtime.bus import nats_status
from shared import subjects
from shared.events import INVALID, TOO_LARGE, Reply
from shared.jobkeys import local_id
from shared.subjects import SubjectError, check_token
from shared.tenants import Principal, TenantsFile


def create_app(settings: GatewaySettings | None = None, *, tenants: TenantsFile | None
               ) -> FastAPI:
    """The gateway app; it connects to NATS in its lifespan. ``tenants``
    authenticates every request (:mod:`gateway.access`); None makes every
    caller an admin (``--insecure``)."""
    settings = settings or GatewaySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bus = await GatewayBus.open(settings.runtime, settings.request_timeout)
        app.state.bus = bus
        bus.log.info("gateway connected", nats=nats_status(bus.nc))
        hub = app.state.hub = Hub(bus, settings.ui_sample_s, keep=720)
        hub.start()
        try:
            yield
        finally:
            await hub.stop()
            await bus.close()

    app = FastAPI(
        title="Hops gateway",
        summary="Submit, cancel and watch deep-learning training jobs on a Hops cluster.",
        version="1",
        lifespan=lifespan,
        docs_url=None,
    )
    app.state.settings = settings
    app.state.tenants = tenants
    app.add_exception_handler(Refused, on_refused)
    app.add_exception_handler(nats.errors.Error, _nats_failure)
    app.add_exception_handler(RequestValidationError, _bad_parameter)
    app.add_exception_handler(StarletteHTTPException, _http_failure)
    _submit_route(app, settings.max_body)
    _list_route(app)
    _job_routes(app)
    timeline_routes(app)
    log_routes(app)
    params_routes(app)
    cluster_routes.cluster_routes(app)
    cluster_routes.node_routes(app)
    cluster_routes.tenant_routes(app)
    reload_routes(app)
    signature_routes(app)
    ui_routes(app)
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]
    return app


def _submit_route(app: FastAPI, limit: int) -> None:
    @app.post(
        "/jobs",
        status_code=201,
        summary="Submit a job",
        description="Body: a JobSpec, or a `submit_job` message (docs/events.md).",
        openapi_extra=submit_body_schema(),
        responses={
            400: {"description": "malformed JSON or unknown message type"},
            409: {"description": "a job with this id exists"},
            413: {"description": f"body above {limit} bytes"},
            422: {"description": "invalid job spec (the message names the field)"},
            **ERRORS,
        },
    )
    async def submit(request: Request, principal: Caller) -> JSONResponse:
        bus = bus_of(request)
        body = await _read_limited(request, limit)
        if body is None:
            size = request.headers.get("content-length")
            error = views.too_large_error(int(size) if size and size.isdigit() else None, limit)
            await bus.reporter.report(subjects.JOBS_SUBMIT, f"POST /jobs: {error}", TOO_LARGE)
            return failure(413, TOO_LARGE, error)
        forwarded = access.submit_body(principal, body)
        if isinstance(forwarded, access.Denied):
            raise Refused(principal, forwarded)
        try:
            reply = await bus.submit(forwarded)
        except (Unavailable, BadUpstream) as e:
            return upstream_failure(e)
        log = bus.log.bind(job_id=reply.job_id) if reply.job_id else bus.log
        log.info("submit answered", ok=reply.ok, code=reply.code,
                 identity=access.identity(principal))
        status = views.reply_status(reply, ok_status=201)
        # the gateway submits as a trusted caller: the reply names the job's key
        headers = {"Location": access.job_location(principal, reply.job_id)} if reply.ok else None
        shown = msgspec.structs.replace(reply, job_id=local_id(reply.job_id))
        return respond(status, views.reply_body(shown), headers)


def _list_route(app: FastAPI) -> None:
    @app.get(
        "/jobs",
        summary="Jobs, a page at a time",
        description=(
            "Oldest submission first (ties by job id), at most `limit` jobs; follow "
            "`next_cursor` until it is null to see every job. The cursor is opaque and "
            "stable: a job submitted meanwhile is listed once, on a later page."
        ),
        responses={200: json_response("One page of jobs", "JobPage"),
                   400: json_response("invalid phase, limit or cursor", "Error")},
    )
    async def list_jobs(
        request: Request,
        principal: Caller,
        phase: Annotated[str | None, Query(
            description="only jobs in this phase", json_schema_extra={"enum": list(views.PHASES)}
        )] = None,
        tenant: Annotated[str | None, Query(
            description="only this tenant's jobs (a tenant's token lists only its own)"
        )] = None,
        limit: Annotated[int, Query(
            ge=1, le=pages.MAX_LIMIT, description="jobs per page"
        )] = pages.DEFAULT_LIMIT,
        cursor: Annotated[str | None, Query(
            description="`next_cursor` of the previous page"
        )] = None,
    ) -> JSONResponse:
        listed = access.list_tenant(principal, tenant)
        if isinstance(listed, access.Denied):
            raise Refused(principal, listed)
        try:
            query = pages.JobQuery(
                phase=views.check_phase(phase), tenant=listed, limit=limit,
                after=pages.Cursor.decode(cursor) if cursor is not None else None,
            )
        except ValueError as e:
            return failure(400, INVALID, str(e))
        bus = bus_of(request)
        records = await bus.jobs()
        explains = await bus.explains()
        viewer = ADMIN if principal.admin else Viewer(
            tenant=principal.tenant, tenants={r.job_id: r.spec.tenant for r in records})
        return respond(200, views.jobs_view(
            records, time.time(), query,
            extra=lambda r: list_fields(explains.get(r.job_id), viewer)))


def _job_routes(app: FastAPI) -> None:
    @app.get("/jobs/{job_id}", summary="One job, why it waits and when it should run",
             description="The record, and the leader's word on it: `why` (the reason: "
             "`code`, `message`, details), `receipt` (its last stop), `forecast` (position, "
             "start and finish with their 10th-90th percentile interval, what-if "
             "alternatives), `throughput` and Kubernetes-style `conditions` "
             "(docs/explain.md). A tenant sees other tenants' jobs as \"another tenant's job\".",
             responses={200: json_response("The job", "JobDetail"), **ONE_JOB_REFUSALS})
    async def get_job(request: Request, job_id: str, principal: Caller,
                      tenant: TenantParam = None) -> JSONResponse:
        key, record = await visible_job(request, principal, job_id, tenant)
        if record is None:
            return failure(404, views.NOT_FOUND, f"no job {job_id!r}")
        return respond(200, await job_body(request, principal, key, record, time.time()))

    @app.delete(
        "/jobs/{job_id}",
        summary="Cancel a job",
        responses={
            404: {"description": "no such job"},
            409: {"description": "the job has already ended"},
            **ERRORS,
        },
    )
    async def cancel(request: Request, job_id: str, principal: Caller,
                     reason: str = "", tenant: TenantParam = None) -> JSONResponse:
        return await _job_request(request, (job_id, tenant), principal, "cancel",
                                  lambda bus, key: bus.cancel(key, reason))

    for verb, hold in (("hold", True), ("release", False)):
        _hold_route(app, verb, hold)


def _hold_route(app: FastAPI, verb: str, hold: bool) -> None:
    @app.post(f"/jobs/{{job_id}}/{verb}", summary=f"{verb.capitalize()} a waiting job",
              responses={404: {"description": "no such job"},
                         409: {"description": "it has ended, or (hold) it runs: not_pending"},
                         **ERRORS})
    async def hold_or_release(request: Request, job_id: str, principal: Caller,
                              reason: str = "", tenant: TenantParam = None) -> JSONResponse:
        return await _job_request(request, (job_id, tenant), principal, verb,
                                  lambda bus, key: bus.hold(key, hold, reason))


async def _job_request(request: Request, named: tuple[str, str | None], principal: Principal,
                       verb: str, call: Callable[[GatewayBus, str], Awaitable[Reply]]
                       ) -> JSONResponse:
    """Cancel, hold or release the job ``named`` (its id and ``?tenant=``)
    through ``call``, which gets its key: a tenant only its own jobs
    (another's answers 404, as an unknown id)."""
    bus = bus_of(request)
    job_id, tenant = named
    try:
        check_token(job_id, "job id")
    except SubjectError as e:
        return failure(404, views.NOT_FOUND, str(e))
    key, record = await visible_job(request, principal, job_id, tenant)
    if record is None and not principal.admin:
        # the answer to another tenant's job (visible_job), word for word
        return failure(404, views.NOT_FOUND, f"no job {job_id!r}")
    try:
        reply = await call(bus, key)
    except (Unavailable, BadUpstream) as e:
        return upstream_failure(e)
    bus.log.info(f"{verb} answered", job_id=key, ok=reply.ok, code=reply.code,
                 identity=access.identity(principal))
    shown = msgspec.structs.replace(reply, job_id=job_id)
    return respond(views.reply_status(reply), views.reply_body(shown))


async def _nats_failure(request: Request, exc: Exception) -> JSONResponse:
    """A KV read that failed on NATS (e.g. while reconnecting): 503, not 500."""
    bus_of(request).log.warning("nats failure", path=request.url.path, error=repr(exc))
    return failure(503, views.UNAVAILABLE, views.nats_error(exc))


async def _http_failure(request: Request, exc: Exception) -> JSONResponse:
    """A path or method the gateway does not serve: the gateway's error
    shape and a sentence, rather than Starlette's ``{"detail": ...}``."""
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
    error = views.route_error(status, request.method, request.url.path)
    return failure(status, views.code_of_status(status), error)


async def _bad_parameter(_request: Request, exc: Exception) -> JSONResponse:
    """A query parameter FastAPI refused (e.g. ``limit=0``): 400 in the
    gateway's error shape with one sentence, not FastAPI's 422 list."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return failure(400, INVALID, views.parameter_error(errors))


async def _read_limited(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to exceed ``limit`` bytes
    (from ``Content-Length``, else while reading), so that a huge body is
    never held in memory."""
    if views.declared_too_large(request.headers.get("content-length"), limit):
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
