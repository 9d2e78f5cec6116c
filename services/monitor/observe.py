"""What the monitor observes from what it sees on the bus (pure).

The histograms and counters of ``GET /metrics`` that no bucket holds are
fed as events come (:mod:`services.monitor.instruments` applies them):

* ``hops_queue_wait_seconds{tenant}``: a job's submission (``job_submitted``
  at, else its record's ``submitted_at``) to its first ``job_started``;
* ``hops_admission_latency_seconds``: admission's own time from a submit
  request to its acceptance (``job_submitted``'s ``admission_s``);
* ``hops_plan_solve_seconds``: the leader's planning time (``plan_issued``'s
  ``solve_s``);
* ``hops_forecast_error_seconds``: at a job's first start, |start - the start
  that the job's last forecast in ``hops_explain`` said|;
* ``hops_restarts_total{tenant}``: a start of a job that started before;
* ``hops_preemptions_total{rule}``: a stop's receipt on ``HOPS_TIMELINE``;
* ``hops_refusals_total{code}``: error records that are refusals
  (:func:`refusal_code`).

Each label takes values from a bounded set: tenants of the tenants file
(admission refuses others), the stop rules, the refusal codes. No job id is
a label. What is kept per job is forgotten when the job ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shared import subjects
from shared.events import ErrorRecord, JobEvent, JobStarted, JobSubmitted, PlanIssued
from shared.explain import STOP_RULES, TimelineEntry
from shared.ids import JobId
from shared.records import JobRecord
from shared.wire import (
    FORBIDDEN,
    INVALID,
    PLAN_REFUSED,
    TOO_LARGE,
    UNAUTHORIZED,
    UNKNOWN_TENANT,
    UNSCHEDULABLE,
)

QUEUE_WAIT = "hops_queue_wait_seconds"
ADMISSION = "hops_admission_latency_seconds"
PLAN_SOLVE = "hops_plan_solve_seconds"
FORECAST_ERROR = "hops_forecast_error_seconds"
RESTARTS = "hops_restarts_total"
PREEMPTIONS = "hops_preemptions_total"
REFUSALS = "hops_refusals_total"

# Refusals of whoever asked, whatever the service: of an identity, of a
# plan that over-allocated, of a submission admission would not accept.
# ``invalid`` and ``too_large`` are refusals only of a request on a jobs
# subject (elsewhere they name a record the service could not read).
ALWAYS_REFUSALS = (FORBIDDEN, UNAUTHORIZED, PLAN_REFUSED, UNSCHEDULABLE, UNKNOWN_TENANT)
REQUEST_REFUSALS = (INVALID, TOO_LARGE)
REFUSAL_LABELS: tuple[str, ...] = (*ALWAYS_REFUSALS, *REQUEST_REFUSALS)
PREEMPTION_RULES: tuple[str, ...] = STOP_RULES
UNKNOWN = "unknown"  # a tenant the monitor never learnt (a start it saw without the job)

Kind = Literal["histogram", "counter"]


@dataclass(frozen=True)
class Observation:
    """Observe ``value`` in histogram ``metric``, or add it to counter ``metric``."""

    metric: str
    kind: Kind
    value: float
    labels: tuple[tuple[str, str], ...] = ()


def refusal_code(record: ErrorRecord) -> str | None:
    """The code under which ``record`` counts in ``hops_refusals_total``, if any."""
    if record.code in ALWAYS_REFUSALS:
        return record.code
    if record.code in REQUEST_REFUSALS and record.subject.startswith(f"{subjects.PREFIX}.jobs."):
        return record.code
    return None


@dataclass
class JobWatch:
    """What is known of each job until it ends: when it was submitted, by
    which tenant, whether it started, the start its last forecast said."""

    submitted: dict[JobId, tuple[float, str]] = field(default_factory=dict)
    started: set[JobId] = field(default_factory=set)
    forecasts: dict[JobId, float] = field(default_factory=dict)

    def on_job_event(self, event: JobEvent, record: JobRecord | None) -> list[Observation]:
        """What ``event`` adds (``record``: the job's record, if the monitor has one)."""
        job = event.job_id
        if isinstance(event, JobSubmitted):
            self.submitted[job] = (event.at, event.spec.tenant)
            if event.admission_s is None:
                return []
            return [Observation(ADMISSION, "histogram", max(0.0, event.admission_s))]
        if isinstance(event, JobStarted):
            return self._started(event, record)
        if event.__struct_config__.tag in ("job_finished", "job_failed", "job_cancelled"):
            self.forget(job)
        return []

    def _started(self, event: JobStarted, record: JobRecord | None) -> list[Observation]:
        job = event.job_id
        known = self.submitted.get(job)
        if known is None and record is not None:
            known = (record.submitted_at, record.spec.tenant)
        tenant = (("tenant", known[1] if known else UNKNOWN),)
        if job in self.started:
            return [Observation(RESTARTS, "counter", 1.0, tenant)]
        self.started.add(job)
        out: list[Observation] = []
        if known is not None:
            out.append(Observation(QUEUE_WAIT, "histogram", max(0.0, event.at - known[0]),
                                   tenant))
        forecast = self.forecasts.pop(job, None)
        if forecast is not None:
            out.append(Observation(FORECAST_ERROR, "histogram", abs(event.at - forecast)))
        return out

    def on_forecast(self, job: JobId, start: float) -> None:
        """The job's forecast start in ``hops_explain`` (kept until it first starts)."""
        if job not in self.started:
            self.forecasts[job] = start

    def forget(self, job: JobId) -> None:
        self.submitted.pop(job, None)
        self.started.discard(job)
        self.forecasts.pop(job, None)


def on_plan(event: PlanIssued) -> list[Observation]:
    """A plan's solve time, when its leader measured it."""
    if event.solve_s is None:
        return []
    return [Observation(PLAN_SOLVE, "histogram", max(0.0, event.solve_s))]


def on_timeline(entry: TimelineEntry) -> list[Observation]:
    """A stop's receipt is a preemption, by the rule that stopped the job."""
    if entry.receipt is None:
        return []
    return [Observation(PREEMPTIONS, "counter", 1.0, (("rule", entry.receipt.rule),))]


def on_error(record: ErrorRecord) -> list[Observation]:
    code = refusal_code(record)
    return [] if code is None else [Observation(REFUSALS, "counter", 1.0, (("code", code),))]
