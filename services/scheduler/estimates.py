"""The leader's estimate requests (``hops.v1.estimate``, queue group
``estimator``): the estimators' answers where they answer, the last
estimates otherwise (Hops §3.3); and the ``job_profiled`` events of the
types jobs take from shared profiles (:mod:`scheduling.live.reuse`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from structlog.typing import FilteringBoundLogger

from services.runtime.bus import publish_event, request
from shared import events as ev
from shared import subjects
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId


async def fetch_estimates(
    nc: NATS,
    requests: Sequence[ev.EstimateRequest],
    last: Mapping[JobId, JobEstimate],
    timeout: float,
    log: FilteringBoundLogger,
    shared: dict[JobId, frozenset[GpuType]] | None = None,
) -> dict[JobId, JobEstimate]:
    """Estimates of the jobs of ``requests``: each request's answer, or the
    ``last`` ones of its jobs when the estimators do not answer in time.
    ``shared``, when given, gets each answered job's signature's shared
    profile types (``EstimateReply.shared``)."""
    estimates = dict(last)
    for req in requests:
        try:
            reply = await request(nc, subjects.ESTIMATE, req, ev.decode_estimate_reply,
                                  timeout=timeout)
        except (nats.errors.Error, ev.WireError, TimeoutError) as e:
            log.warning("no estimates", error=repr(e), jobs=len(req.jobs))
            continue
        if not reply.ok:
            log.warning("estimate request failed", code=reply.code, error=reply.error)
        estimates.update(reply.estimates)
        if shared is not None:
            shared.update({k: frozenset(v) for k, v in reply.shared.items()})
    wanted = {job.id for req in requests for job in req.jobs}
    return {k: v for k, v in estimates.items() if k in wanted}


async def publish_reused(
    js: JetStreamContext,
    reused: Mapping[JobId, tuple[GpuType, ...]],
    now: float,
    log: FilteringBoundLogger,
) -> None:
    """Publish ``job_profiled`` with each job's cumulative list, own and
    reused types (:func:`scheduling.live.reuse.reuse_events`); its message id
    is keyed by the list, so a repeat in the next plan publishes nothing new."""
    for job_id, types in reused.items():
        event = ev.JobProfiled(job_id=job_id, gpu_types=types, at=now)
        await publish_event(js, subjects.job_events(job_id), event,
                            msg_id=f"{job_id}:reused:{','.join(types)}")
        log.info("profiles reused", job_id=job_id, gpu_types=list(types))
