"""``GET /jobs/{id}/params``: a Hare task job's final parameters, as its
aggregator saved them once its last round was applied (object
``<job>/final`` in the object store ``hops_aggregator``; docs/hare.md §7,
step 3b), byte for byte: ``hops.aggregator.codec``'s encoding, which
``hops.aggregator.codec.decode_params`` turns back into the model's named
tensors (``application/octet-stream``).

Access is ``GET /jobs/{id}``'s (:func:`gateway.explain_routes.visible_job`):
a tenant reads only its own jobs' parameters, another tenant's job is a 404
as a missing one; admins read any. A job that has none answers 409 with
the code :data:`NO_FINAL_PARAMS` and why: not a task job (no command, or
not relaxed), not finished yet, or ended without them (failed, cancelled,
or run by a round-based policy). Registered by :func:`gateway.app.create_app`.
"""

from __future__ import annotations

import nats.errors
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gateway import views
from gateway.auth import Caller
from gateway.explain_routes import ONE_JOB_REFUSALS, TenantParam, visible_job
from gateway.responses import bus_of, failure
from services.runtime.objects import ObjectError, get_object
from shared import subjects
from shared.gradients import final_name
from shared.jobkeys import local_id
from shared.records import JobRecord

NO_FINAL_PARAMS = "no_final_params"
OCTETS = "application/octet-stream"


def no_params_words(record: JobRecord) -> str:
    """Why ``record``'s job has no final parameters stored (pure)."""
    job = local_id(record.job_id)
    spec = record.spec
    if not spec.command or spec.sync_scale < 1:
        return (f"job {job} is not a task job: only a relaxed job (sync_scale > 0) with a "
                "command, run as Hare's tasks, has its final parameters kept by its aggregator")
    if not record.final:
        return f"job {job} is {record.phase}: its final parameters are saved once it finishes"
    if record.phase != "finished":
        return f"job {job} {record.phase} before its last round: it has no final parameters"
    return (f"job {job} finished without final parameters: it did not run as Hare's tasks "
            "(a round-based policy), or its aggregator's store lost them")


def params_routes(app: FastAPI) -> None:
    @app.get("/jobs/{job_id}/params", summary="A task job's final parameters",
             description="The parameters the job's aggregator saved after its last round "
             "(object `<job>/final` in `hops_aggregator`), as `application/octet-stream`: "
             "`hops.aggregator.codec.decode_params` gives the model's named tensors. 409 "
             f"`{NO_FINAL_PARAMS}` for a job without them (not a task job, not finished, "
             "or ended otherwise).",
             response_class=Response, response_model=None,
             responses={200: {"description": "the parameters", "content": {OCTETS: {}}},
                        409: {"description": f"`{NO_FINAL_PARAMS}`: the job has none"},
                        503: {"description": "the object store did not answer in time"},
                        **ONE_JOB_REFUSALS})
    async def job_params(request: Request, job_id: str, principal: Caller,
                         tenant: TenantParam = None) -> Response:
        key, record = await visible_job(request, principal, job_id, tenant)
        if record is None:
            return failure(404, views.NOT_FOUND, f"no job {job_id!r}")
        if not record.spec.command or record.spec.sync_scale < 1:
            return failure(409, NO_FINAL_PARAMS, no_params_words(record))
        bus = bus_of(request)
        try:
            data = await get_object(bus.js, subjects.OBJ_AGGREGATOR, final_name(key))
        except (TimeoutError, nats.errors.Error) as e:
            return failure(503, views.UNAVAILABLE, f"the object store: {e!r}")
        except ObjectError as e:
            return failure(502, views.BAD_GATEWAY, str(e))
        if data is None:
            return failure(409, NO_FINAL_PARAMS, no_params_words(record))
        name = local_id(record.job_id)
        return Response(data, media_type=OCTETS, headers={
            "Content-Disposition": f'attachment; filename="{name}.params"'})
