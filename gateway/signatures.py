"""Profile signatures for operators (:mod:`shared.reuse`, docs/live.md,
"Profiles reused"): ``GET /signatures`` and ``POST
/signatures/{signature}/reprofile``, admins only (``hops signatures``).

The listing comes from an estimator replica (``hops.v1.signatures.list``):
each signature's GPU types with a current shared profile and the stale
ones, joined here with the jobs of ``hops_jobs`` that have the signature
(its model and batch size, and the ids of those not ended). A reprofile is
a ``profile_stale`` event published on ``hops.v1.signatures.stale`` (stream
``HOPS_SAMPLES``), which every estimator replica applies in stream order;
the signature's *next* job is then profiled on those types, and jobs past
profiling keep their estimates. The answer comes once a replica lists the
types as stale (``applied``), or after the request timeout with
``applied: false``. An unknown signature is a 404 and a type it holds no
profile of a 422: nothing is published.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import msgspec
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway import access, views
from gateway.auth import Caller, check
from gateway.bus import BadUpstream, GatewayBus, Unavailable
from gateway.responses import ERRORS, bus_of, failure, respond, upstream_failure
from services.runtime.bus import publish_event
from shared import events as ev
from shared import subjects
from shared.events import INVALID, WireError
from shared.ids import GpuType
from shared.records import FINAL_PHASES, JobRecord
from shared.reuse import profile_signature

_POLL_S = 0.1


class ReprofileBody(BaseModel):
    """``POST /signatures/{signature}/reprofile``'s body (optional):
    ``gpu_types`` (none: every type the signature holds a profile of) and a
    ``reason`` for the log."""

    model_config = ConfigDict(extra="forbid")
    gpu_types: list[str] = Field(default_factory=list, max_length=64)
    reason: str = Field(default="", max_length=500)


async def list_signatures(bus: GatewayBus) -> ev.SignaturesReply:
    """An estimator replica's listing (:class:`Unavailable` when none answers)."""
    data = ev.encode(ev.ListSignatures())
    raw = await bus.request(subjects.SIGNATURES_LIST, data)
    try:
        reply = ev.decode_signatures_reply(raw)
    except WireError as e:
        await bus.reporter.report(subjects.SIGNATURES_LIST, f"reply: {e}", e.code, raw)
        raise BadUpstream(f"bad reply on {subjects.SIGNATURES_LIST}: {e}") from None
    if not reply.ok:
        raise BadUpstream(f"the estimator failed to list signatures: {reply.error}")
    return reply


def signatures_view(reply: ev.SignaturesReply, jobs: Iterable[JobRecord]) -> dict[str, Any]:
    """``GET /signatures``' body: per signature its current and stale types
    and the batch size of its last profile, with the model and the jobs of
    it that ``jobs`` holds (``jobs``: those not ended)."""
    by_sig: dict[str, list[JobRecord]] = {}
    for rec in jobs:
        sig = profile_signature(rec.spec)
        if sig:
            by_sig.setdefault(sig, []).append(rec)
    out = []
    for entry in reply.signatures:
        recs = sorted(by_sig.get(entry.signature, ()), key=lambda r: r.job_id)
        model = recs[0].spec.model if recs else ""
        batch = entry.batch_size or (recs[0].spec.batch_size if recs else 0)
        live = [r.job_id for r in recs if r.phase not in FINAL_PHASES]
        out.append({**msgspec.to_builtins(entry), "model": model, "batch_size": batch,
                    "jobs": live})
    return {"signatures": out, "count": len(out)}


def find(reply: ev.SignaturesReply, signature: str) -> ev.SharedSignature | None:
    return next((s for s in reply.signatures if s.signature == signature), None)


def targets(entry: ev.SharedSignature, asked: Sequence[str]) -> tuple[GpuType, ...] | str:
    """The types a reprofile marks (``asked``, or all the signature holds),
    or why ``asked`` names one it holds no profile of."""
    held = (*entry.current, *entry.stale)
    unknown = sorted(set(asked) - set(held))
    if unknown:
        return (f"signature {entry.signature} holds no profile on {', '.join(unknown)} "
                f"(it holds {', '.join(sorted(held)) or 'none'})")
    return tuple(sorted({GpuType(t) for t in asked} if asked else set(held)))


async def _await_applied(bus: GatewayBus, signature: str, types: Sequence[GpuType]) -> bool:
    """Whether an estimator replica lists ``types`` of ``signature`` as stale
    within the request timeout."""
    deadline = time.monotonic() + bus.timeout
    while True:
        entry = find(await list_signatures(bus), signature)
        if entry is not None and set(types) <= set(entry.stale):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)


async def _reprofile(bus: GatewayBus, signature: str, asked: ReprofileBody,
                     who: str) -> JSONResponse:
    entry = find(await list_signatures(bus), signature)
    if entry is None:
        return failure(404, views.NOT_FOUND, f"no shared profile of signature {signature!r}")
    types = targets(entry, asked.gpu_types)
    if isinstance(types, str):
        return failure(422, INVALID, types)
    event = ev.ProfileStale(signature=signature, reason="operator", at=time.time(),
                            gpu_types=types)
    await publish_event(bus.js, subjects.SIGNATURES_STALE, event)
    bus.log.info("reprofile asked", signature=signature, gpu_types=list(types), by=who,
                 reason=asked.reason)
    applied = await _await_applied(bus, signature, types)
    return respond(200, {"ok": True, "signature": signature, "gpu_types": list(types),
                         "applied": applied})


def signature_routes(app: FastAPI) -> None:
    @app.get("/signatures", summary="Profile signatures and their shared profiles",
             description="For admins only. Per signature: the GPU types it holds a current "
             "shared profile of, the stale ones, its model and batch size, and its jobs "
             "that have not ended.", responses=ERRORS)
    async def signatures(request: Request, principal: Caller) -> JSONResponse:
        check(principal, access.admin_only(principal, "listing profile signatures"))
        bus = bus_of(request)
        try:
            reply = await list_signatures(bus)
        except (Unavailable, BadUpstream) as e:
            return upstream_failure(e)
        return respond(200, signatures_view(reply, await bus.jobs()))

    @app.post("/signatures/{signature}/reprofile",
              summary="Profile a signature again: its next job is profiled",
              description="For admins only. Marks the signature's shared profiles on "
              "`gpu_types` (default: all) stale; jobs already past profiling keep their "
              "estimates.",
              responses={404: {"description": "no such signature"},
                         422: {"description": "a type it holds no profile of"}, **ERRORS})
    async def reprofile(request: Request, signature: str, principal: Caller,
                        body: Annotated[ReprofileBody | None, Body()] = None) -> JSONResponse:
        check(principal, access.admin_only(principal, "reprofiling a signature"))
        bus = bus_of(request)
        try:
            return await _reprofile(bus, signature, body or ReprofileBody(),
                                    access.identity(principal))
        except (Unavailable, BadUpstream) as e:
            return upstream_failure(e)
