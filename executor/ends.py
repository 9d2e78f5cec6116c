"""A node's jobs as they end: their GPUs and cores freed, their output
shipped, and the verdict their end calls for published.

A job whose processes end without being asked to stop gets the event its
backend's outcome names: ``job_finished`` (msg_id ``<job>:job_finished``) or
``job_failed`` (msg_id ``<job>:job_failed``, the monitor's id for the same
verdict, so that a failure is recorded once); a job being stopped, or whose
start failed, is answered by that command's acknowledgement instead. The
executor service (:mod:`executor.service`) books jobs and answers commands;
:class:`JobEnds` is what follows each of them to its end.
"""

from __future__ import annotations

import asyncio
import time

from nats.js import JetStreamContext
from structlog.typing import FilteringBoundLogger

from executor.backend import Backend, JobHandle
from executor.ledger import NodeLedger
from executor.logship import LogShipper
from executor.publish import publish_retrying
from shared import subjects
from shared.events import JobFailed, JobFinished
from shared.ids import JobId, ServerId


class JobEnds:
    """The running jobs of one server (``procs``, shared with the service)
    and what their ends call for (see the module docstring)."""

    def __init__(self, js: JetStreamContext, server_id: ServerId, procs: dict[JobId, JobHandle],
                 ledger: NodeLedger, shipper: LogShipper, backend: Backend,
                 log: FilteringBoundLogger) -> None:
        self.js = js
        self.server_id = server_id
        self.procs = procs
        self.ledger = ledger
        self.shipper = shipper
        self.backend = backend
        self.log = log

    def follow(self, job: JobHandle) -> None:
        """A job now runs here: listed, and its output shipped."""
        self.procs[job.cmd.job_id] = job
        self.shipper.follow(job.cmd.job_id)

    def forget(self, job: JobHandle) -> None:
        """The job's processes are gone: free its GPUs, ship the rest of its output."""
        if self.procs.get(job.cmd.job_id) is job:
            del self.procs[job.cmd.job_id]
            self.ledger.release(job.cmd.job_id)
            self.shipper.finish(job.cmd.job_id)
        self.backend.forget(job)

    async def watch(self, job: JobHandle, acked: asyncio.Future[bool]) -> None:
        """Follow a job to its end; publish what its outcome calls for."""
        outcome = await job.wait()
        self.forget(job)
        if job.stopping or not await acked:
            return  # a stop is acknowledged by the stop; a failed start by the start
        event = outcome.event
        if event is None:
            job.log.info("job processes ended", samples_done=job.samples_done,
                         exit_code=outcome.exit_code)
        elif isinstance(event, JobFinished):
            job.log.info("job finished", samples_done=job.samples_done,
                         exit_code=outcome.exit_code)
            await self.report(event, f"{event.job_id}:job_finished", job.log)
        else:
            job.log.warning("job process failed", exit_code=event.exit_code,
                            reason=event.reason)
            await self.publish_failed(event)

    async def fail(self, job_id: JobId, reason: str, exit_code: int | None = None,
                   log_tail: str = "") -> None:
        """Fail a job that cannot run (its start refused as impossible anywhere)."""
        await self.publish_failed(JobFailed(job_id=job_id, at=time.time(), reason=reason,
                                            exit_code=exit_code, log_tail=log_tail))

    async def publish_failed(self, event: JobFailed) -> None:
        """``job_failed`` (msg_id shared with the monitor: recorded once). A
        failure not published is still caught by the monitor's deadlines."""
        await self.report(event, f"{event.job_id}:job_failed", self.log.bind(job_id=event.job_id))

    async def report(self, event: JobFinished | JobFailed, msg_id: str,
                     log: FilteringBoundLogger) -> None:
        """Publish a job's verdict for the monitor to check and relay."""
        await publish_retrying(self.js, subjects.reports(self.server_id, event.job_id), event,
                               msg_id, log)
