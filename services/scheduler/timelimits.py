"""The leader's end of jobs over their ``time_limit``: which running jobs
are over it (:mod:`scheduling.live.timelimit`), and the ``job_cancelled`` of
reason ``TimeLimit`` it publishes for each (the monitor stops it with a
checkpoint and releases its GPUs, as for a user's cancel)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from nats.js import JetStreamContext
from structlog.typing import FilteringBoundLogger

from scheduling.live import timelimit as tl
from scheduling.live.lease import Lease
from scheduling.live.state import LiveJobRecord
from services.runtime.bus import publish_event
from shared import events as ev
from shared import subjects
from shared.ids import JobId
from shared.wire import TIME_LIMIT


class TimeLimits:
    """The jobs a leader has ended at their limit, until their records are final."""

    def __init__(self) -> None:
        self.timed_out: set[JobId] = set()  # ended at their time limit, not yet final

    async def end_over_limit(self, records: Mapping[JobId, LiveJobRecord], now: float,
                             lease: Lease, js: JetStreamContext,
                             log: FilteringBoundLogger,
                             ended: Callable[[JobId, float], Awaitable[None]] | None = None,
                             ) -> float | None:
        """End each running job of ``records`` over its ``time_limit`` while
        ``lease`` is held, telling ``ended`` (its receipt, rule ``TimeLimit``);
        the seconds until the next limit."""
        self.timed_out = {j for j in self.timed_out if j in records and not records[j].final}
        found = tl.limits(records.values(), now, self.timed_out)
        for job_id in found.over:
            if not lease.is_leader(time.time()):
                return found.next_in
            event = ev.JobCancelled(job_id=job_id, at=now, reason=TIME_LIMIT)
            # the cancel's id: a user's cancel of the same job is the same end
            await publish_event(js, subjects.job_events(job_id), event,
                                msg_id=f"{job_id}:job_cancelled")
            self.timed_out.add(job_id)
            if ended is not None:
                await ended(job_id, now)
            log.info("job ended at its time limit", job_id=job_id,
                     time_limit=records[job_id].spec.time_limit)
        return found.next_in
