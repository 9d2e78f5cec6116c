"""The monitor's relay of executors' reports, and its audit of refusals.

Executors publish what they say of a job on
``hops.v1.reports.<server_id>.<job_id>`` (stream ``HOPS_REPORTS``), the
only job subjects their NATS identities may use. The relay (durable
``monitor-reports``) judges each report with
:func:`services.monitor.authz.judge_report` and publishes the accepted ones
to their canonical subjects (``hops.v1.samples.<job>``,
``hops.v1.profiles.<job>``, ``hops.v1.jobs.events.<job>``) with the
executor's ``Nats-Msg-Id`` (a sample has none: the relay uses
``report:<stream sequence>``), so a report delivered twice is stored once
and every consumer downstream reads what it read before. A refused report
is audited (:func:`audit`) and terminated; one not judged yet is
redelivered after ``retry_s``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.msg import Msg

from services.monitor.authz import (
    PlacementHistory,
    Refuse,
    Wait,
    judge_report,
    planned,
    sequenced,
)
from services.runtime.bus import ErrorReporter
from services.runtime.consumer import ConsumerSpec, Delivery, Later, Terminate, consume
from services.runtime.retry import publish_retried
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import (
    FORBIDDEN,
    Message,
    PlanEvent,
    PlanIssued,
    TaskSequence,
    WireError,
    decode_any,
    decode_plan_event,
    decode_task_event,
    encode,
)

DURABLE = "monitor-reports"
PLANS_DURABLE = "monitor-plans"


@dataclass(frozen=True)
class RelaySettings:
    """``tries`` deliveries ``retry_s`` apart before a report for a job not
    known to be placed on its server is refused; a relay that fails (NATS
    is briefly away) is retried ``publish_tries`` more times, as long as an
    executor would have retried its own publish (a lost ``job_finished``
    would have the job requeued)."""

    tries: int = 10
    retry_s: float = 0.5
    fetch_timeout_s: float = 1.0
    publish_tries: int = 120

    @classmethod
    def waiting(cls, wait_s: float, retry_s: float, fetch_timeout_s: float) -> RelaySettings:
        """Tries ``retry_s`` apart over about ``wait_s`` seconds."""
        return cls(1 + max(1, math.ceil(wait_s / retry_s)), retry_s, fetch_timeout_s)


def executor_identity(sid: str) -> str:
    """The NATS identity that alone may publish the subjects of server ``sid``."""
    return f"executor-{sid}"


async def audit(reporter: ErrorReporter, sid: str, subject: str, reason: str,
                data: bytes = b"") -> None:
    """Log and publish a refusal of what server ``sid``'s executor sent."""
    await reporter.refused(executor_identity(sid), subject, reason, FORBIDDEN, data)


class ReportRelay:
    """Relays checked reports (see the module)."""

    def __init__(self, ctx: ServiceContext, history: PlacementHistory,
                 settings: RelaySettings) -> None:
        self.ctx = ctx
        self.history = history
        self.settings = settings
        self.relayed = 0

    def spec(self) -> ConsumerSpec:
        s = self.settings
        return ConsumerSpec(subjects.STREAM_REPORTS.name, DURABLE, subjects.REPORTS_ALL,
                            fetch_timeout=s.fetch_timeout_s, nak_delay=s.retry_s,
                            max_deliver=s.tries + s.publish_tries)

    async def run(self) -> None:
        await consume(self.ctx.js, self.spec(), decode_any, self.handle, self.ctx.reporter,
                      self.ctx.stopping)

    async def handle(self, msg: Message, delivery: Delivery) -> None:
        sid, job = subjects.last_two_tokens(delivery.subject, subjects.REPORTS_ALL)
        msg_id = delivery.msg_id or f"report:{delivery.stream_seq}"
        last = delivery.num_delivered >= self.settings.tries
        verdict = judge_report(msg, sid, job, msg_id, self.history, last)
        if isinstance(verdict, Wait):
            raise Later(verdict.reason)
        if isinstance(verdict, Refuse):
            await audit(self.ctx.reporter, sid, delivery.subject, verdict.reason, encode(msg))
            raise Terminate(verdict.reason)
        await publish_retried(self.ctx.js, verdict.subject, encode(msg), msg_id=verdict.msg_id)
        self.relayed += 1


async def follow_plans(ctx: ServiceContext, history: PlacementHistory, fetch_s: float,
                       on_issued: Callable[[PlanIssued], None] = lambda _: None) -> None:
    """Note where each plan puts each job (durable ``monitor-plans``): a start
    an executor refuses leaves no ``hops_alloc`` entry, only its plan. Each
    plan also goes to ``on_issued`` (its solve time, for the metrics)."""

    async def on_plan(event: PlanEvent, delivery: Delivery) -> None:
        if isinstance(event, PlanIssued):
            for job, servers in planned(event.plan).items():
                history.placed(job, servers)
            on_issued(event)

    spec = ConsumerSpec(subjects.STREAM_PLANS.name, PLANS_DURABLE, subjects.PLANS,
                        fetch_timeout=fetch_s)
    await consume(ctx.js, spec, decode_plan_event, on_plan, ctx.reporter, ctx.stopping)


async def follow_sequences(ctx: ServiceContext, history: PlacementHistory) -> None:
    """Note the servers Hare's task sequences give each job entries on (core
    NATS, the leader's resends): a task job's ``job_failed`` comes from the
    server whose task failed, which its ``job_started`` may not name (a
    replan moves tasks). One that does not decode is the executors' to
    report; it places nothing."""

    async def on_sequence(msg: Msg) -> None:
        try:
            seq = decode_task_event(msg.data)
            sid = subjects.last_token(msg.subject, subjects.TASK_SEQ_ALL)
        except (WireError, subjects.SubjectError):
            return
        if isinstance(seq, TaskSequence):
            for job, servers in sequenced(seq, sid).items():
                history.placed(job, servers)

    await ctx.nc.subscribe(subjects.TASK_SEQ_ALL, cb=on_sequence)
