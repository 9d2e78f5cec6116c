"""The leader's estimate requests (``hops.v1.estimate``, queue group
``estimator``): the estimators' answers where they answer, the last
estimates otherwise (Hops §3.3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import nats.errors
from nats.aio.client import Client as NATS
from structlog.typing import FilteringBoundLogger

from services.runtime.bus import request
from shared import events as ev
from shared import subjects
from shared.estimate import JobEstimate
from shared.ids import JobId


async def fetch_estimates(
    nc: NATS,
    requests: Sequence[ev.EstimateRequest],
    last: Mapping[JobId, JobEstimate],
    timeout: float,
    log: FilteringBoundLogger,
) -> dict[JobId, JobEstimate]:
    """Estimates of the jobs of ``requests``: each request's answer, or the
    ``last`` ones of its jobs when the estimators do not answer in time."""
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
    wanted = {job.id for req in requests for job in req.jobs}
    return {k: v for k, v in estimates.items() if k in wanted}
