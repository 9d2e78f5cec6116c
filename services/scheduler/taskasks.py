"""What the leader's task loop asks for a job it cannot sequence yet
(:mod:`.tasks`, step 2): the estimators' answers, and profiling runs for a
job with no estimate (:mod:`scheduling.live.taskprofile`)."""

from __future__ import annotations

import asyncio
import time

from structlog.typing import FilteringBoundLogger

from scheduling.live import snapshot as snap
from scheduling.live import state as st
from scheduling.live import taskrun as tr
from scheduling.live.lease import Lease
from scheduling.live.taskprofile import ask_now, profiling_tasks, to_estimate
from services.runtime.bus import publish_event
from services.runtime.service import ServiceContext
from services.scheduler.estimates import fetch_estimates
from services.scheduler.jobbook import JobBook
from services.scheduler.settings import SchedulerSettings
from shared import events as ev
from shared import subjects
from shared.estimate import JobEstimate
from shared.ids import JobId
from shared.records import NodeRecord
from shared.snapshot import Plan

ESTIMATE_CHUNK = 32  # jobs per estimate request, as the plan loop asks


class TaskAsks:
    """One leader term's estimates and profiling runs asked for."""

    def __init__(self, ctx: ServiceContext, settings: SchedulerSettings, lease: Lease,
                 book: JobBook, log: FilteringBoundLogger, wake: asyncio.Event) -> None:
        self.ctx, self.settings, self.lease, self.book = ctx, settings, lease, book
        self.log, self.wake = log, wake
        self.estimates: dict[JobId, JobEstimate] = {}
        self.estimated_at = 0.0
        self.asked: set[JobId] = set()  # asked of the estimators (profiling_tasks' unanswered)
        self.profiled_at: dict[JobId, float] = {}  # when each job's profiling runs were asked
        self.plans = 0  # the profiling plans this term published

    async def estimate(self, nodes: list[NodeRecord], now: float) -> None:
        """Ask the estimators for the jobs without an estimate, or with a
        profile on a type their estimate lacks (:func:`to_estimate`): at once
        for a job never asked about, else at most once per resend interval."""
        missing = to_estimate(tr.candidates(self.book.current()), self.estimates,
                              {n.server.gpu_type for n in nodes if n.alive})
        if not ask_now(missing, self.asked, now, self.estimated_at, self.settings.task_resend_s):
            return
        self.estimated_at = now
        requests = snap.estimate_requests(missing, snap.cluster_of(nodes), ESTIMATE_CHUNK)
        got = await fetch_estimates(self.ctx.nc, requests, {}, self.settings.estimate_timeout_s,
                                    self.log)
        self.estimates.update(got)
        self.asked |= missing.keys()
        if got:
            self.wake.set()  # a job may be sequenced now

    async def profile(self, nodes: list[NodeRecord], now: float) -> None:
        """Ask for the profiling runs of the jobs with no estimate, in a plan
        of profiling tasks alone (:mod:`scheduling.live.taskprofile`)."""
        tasks = profiling_tasks(tr.candidates(self.book.current()), self.estimates, nodes,
                                self.profiled_at, now, self.asked)
        if not tasks or not self.lease.is_leader(time.time()):
            return
        self.plans += 1
        issued = ev.PlanIssued(round=self.plans, term=self.lease.term,
                               plan=Plan(profiling=tasks), at=now, first_plan=False)
        await publish_event(self.ctx.js, subjects.PLANS, issued,
                            msg_id=f"tasks-profile:{self.lease.term}:{self.plans}:{now:.6f}")
        for job in sorted({t.job_id for t in tasks}):
            self.profiled_at[job] = now
            await self.book.update(job, st.mark_profiling)
        self.log.info("profiling runs asked", profiling=[f"{t.job_id}:{t.gpu_type}@{t.server}"
                                                         for t in tasks])
