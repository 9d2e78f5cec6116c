"""How a node executor publishes what its jobs say.

Everything job-scoped goes to ``hops.v1.reports.<server_id>.<job_id>``
(stream ``HOPS_REPORTS``), the only job subjects the executor's identity
may publish; the monitor checks that the job is placed here and relays
each report to its canonical subject with the same message id. Verdicts
(``job_finished``, ``job_failed``) and profiles are JetStream publishes
with a message id, retried for a while when NATS is briefly away (the id
makes a retry that did get through count once). Samples are a plain
publish: the subject is on ``HOPS_REPORTS`` all the same, and a lost sample
costs the estimator one observation, not worth holding a job for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from structlog.typing import FilteringBoundLogger

from services.runtime.bus import publish_event
from shared import subjects
from shared.events import Report, SampleReported, TaskDone, encode

TRIES = 20
RETRY_S = 0.5


async def publish_retrying(js: JetStreamContext, subject: str, msg: Report | TaskDone,
                           msg_id: str, log: FilteringBoundLogger, tries: int = TRIES) -> bool:
    """Publish ``msg`` to a stream, retrying; False (and a warning) if it never went."""
    for attempt in range(1, tries + 1):
        try:
            await publish_event(js, subject, msg, msg_id=msg_id, timeout=2.0)
            return True
        except Exception as e:
            if attempt == tries:
                log.warning("cannot publish", subject=subject, msg_id=msg_id, error=repr(e))
                return False
            await asyncio.sleep(RETRY_S)
    return False


class NatsSink:
    """Publishes a real job's samples and profile (see the module)."""

    def __init__(self, nc: NATS, js: JetStreamContext, server_id: str,
                 log: FilteringBoundLogger,
                 spawn: Callable[[Coroutine[Any, Any, None], str], object]) -> None:
        self.nc = nc
        self.js = js
        self.server_id = server_id
        self.log = log
        self.spawn = spawn

    async def sample(self, msg: SampleReported) -> None:
        try:
            await self.nc.publish(subjects.reports(self.server_id, msg.sample.job_id),
                                  encode(msg))
        except nats.errors.Error as e:
            self.log.warning("sample not sent", job_id=msg.sample.job_id, error=repr(e))

    def event(self, job_id: str, msg: Report, msg_id: str) -> None:
        """Publish in the background (retried): the caller does not wait."""
        subject = subjects.reports(self.server_id, job_id)

        async def go() -> None:
            await publish_retrying(self.js, subject, msg, msg_id, self.log.bind(job_id=job_id))

        self.spawn(go(), f"publish-{msg_id}")
