"""The leader's explanations, without I/O (shared.explain, docs/events.md).

The pure core decides the reasons of the jobs a plan saw
(:func:`scheduling.explain.with_reasons`), the receipts of a first plan's
stops (:func:`scheduling.explain.receipts`) and the forecast
(:mod:`scheduling.forecast`). Here is what the live leader adds around them:

- the reasons of the jobs its snapshot leaves out (:func:`record_why`: a
  user's hold, an unschedulable job, a job not yet profiling);
- each job's ``hops_explain`` record (:func:`explains`) and which of them
  changed (:func:`changed`);
- the timeline entries (:mod:`shared.explain`, ``TimelineEntry``) of job
  events (:func:`event_entry`), of reasons that changed (:func:`reason_entries`)
  and of forecasts that moved by at least a round (:func:`forecast_entries`);
- the queue view's reasons, positions and forecasts (:func:`fill_queue`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from scheduling.live.state import LiveJobRecord
from shared import events as ev
from shared.explain import JobExplain, JobForecast, QueueForecast, Receipt, TimelineEntry, Why
from shared.ids import JobId
from shared.records import QueueView
from shared.snapshot import Plan, Snapshot
from shared.wire import UNKNOWN_TENANT, UNSCHEDULABLE

# Why a record the snapshot leaves out waits, when its record says so.


def record_why(rec: LiveJobRecord, now: float) -> Why | None:
    """The reason of a job the leader's snapshot leaves out, from its record:
    a user's hold (or a tenant the tenants file lost) is ``Held``; a job
    held as unschedulable is ``Unschedulable`` (a drained node is alive,
    so a job that only drained nodes could run is in the snapshot, and the
    plan's reasons say ``NodeDrained``); a job submitted and not yet
    profiling is ``Profiling``. None for any other."""
    if rec.final or rec.phase == "running":
        return None
    if rec.held:
        return Why(code="Held", message="a user holds it", since=now)
    if rec.reason.startswith(UNKNOWN_TENANT):
        return Why(code="Held", message=f"held: {rec.reason}", since=now)
    if rec.reason.startswith(UNSCHEDULABLE):
        return Why(code="Unschedulable", message=f"no alive node can run it ({rec.reason})",
                   since=now)
    if rec.phase == "submitted":
        return Why(code="Profiling", message="waiting to be profiled", since=now)
    return None


def job_whys(plan: Plan, snapshot: Snapshot, records: Mapping[JobId, LiveJobRecord],
             previous: Mapping[JobId, Why], now: float) -> dict[JobId, Why]:
    """Every waiting job's primary reason: the plan's for the jobs of the
    snapshot it does not run, the record's (:func:`record_why`) for those it
    left out. A reason keeps the ``since`` of ``previous`` while its code
    stays."""
    seen = {j.id for j in snapshot.jobs}
    running = {a.job_id for a in plan.assignments}
    out: dict[JobId, Why] = {k: w for k, w in plan.reasons.why.items() if k not in running}
    for job_id, rec in records.items():
        if job_id not in seen and job_id not in out:
            why = record_why(rec, now)
            if why is not None:
                out[job_id] = why
    return {k: _since(previous.get(k), w, now) for k, w in out.items()}


def _since(old: Why | None, new: Why, now: float) -> Why:
    if old is not None and old.code == new.code:
        return msgspec.structs.replace(new, since=old.since)
    return new if new.since else msgspec.structs.replace(new, since=now)


# --- hops_explain --------------------------------------------------------------


class Sources(msgspec.Struct, frozen=True, kw_only=True):
    """What one job's ``hops_explain`` record is made of (:func:`explains`)."""

    at: float
    round: int
    term: int
    whys: Mapping[JobId, Why]
    receipts: Mapping[JobId, Receipt]
    forecasts: Mapping[JobId, JobForecast] = {}
    estimated: Mapping[JobId, float] = {}  # samples/s the plan expects of running jobs
    measured: Mapping[JobId, float] = {}  # samples/s their heartbeats measure


def throughputs(snapshot: Snapshot, plan: Plan) -> tuple[dict[JobId, float], dict[JobId, float]]:
    """The estimated (the plan's) and measured (the snapshot's) samples/s of
    the jobs ``plan`` runs."""
    estimated = {a.job_id: a.throughput for a in plan.assignments}
    measured = {j.id: j.throughput for j in snapshot.jobs if j.id in estimated and j.throughput}
    return estimated, measured


def explains(records: Iterable[JobId], src: Sources) -> dict[JobId, JobExplain]:
    """The ``hops_explain`` record of each job of ``records`` that is not final."""
    return {
        job_id: JobExplain(
            job_id=job_id, at=src.at, why=src.whys.get(job_id),
            receipt=src.receipts.get(job_id), forecast=src.forecasts.get(job_id),
            round=src.round, term=src.term,
            estimated_throughput=src.estimated.get(job_id, 0.0),
            measured_throughput=src.measured.get(job_id, 0.0),
        )
        for job_id in records
    }


def changed(old: Mapping[JobId, JobExplain],
            new: Mapping[JobId, JobExplain]) -> dict[JobId, JobExplain]:
    """The records of ``new`` that differ from ``old`` in more than their
    time, round and term (those change every plan: writing them all would
    rewrite the whole bucket every round)."""
    def key(e: JobExplain) -> JobExplain:
        return msgspec.structs.replace(e, at=0.0, round=0, term=0)

    return {k: e for k, e in new.items() if k not in old or key(old[k]) != key(e)}


def with_resume(receipt: Receipt, forecast: JobForecast | None) -> Receipt:
    """``receipt`` with ``resume_at`` from the job's latest forecast, when
    that forecast has it waiting (``position`` > 0: a running job's forecast
    start is when it started) and the receipt has none yet."""
    if forecast is None or forecast.position <= 0 or receipt.resume_at is not None:
        return receipt
    return msgspec.structs.replace(receipt, resume_at=forecast.start)


def resumed(receipts: Mapping[JobId, Receipt],
            forecasts: Mapping[JobId, JobForecast]) -> dict[JobId, Receipt]:
    """The receipts a new forecast gives a ``resume_at`` (:func:`with_resume`)."""
    out = {k: with_resume(r, forecasts.get(k)) for k, r in receipts.items()}
    return {k: r for k, r in out.items() if r is not receipts[k]}


# --- the timeline ----------------------------------------------------------------


def event_entry(event: ev.JobEvent) -> TimelineEntry | None:
    """The timeline entry of a job event; None for a stop the leader's
    receipt already told (the caller knows) or an event with no entry."""
    match event:
        case ev.JobSubmitted():
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="submitted")
        case ev.JobProfiled():
            note = f"profiled on {', '.join(event.gpu_types)}"
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="profiled", note=note)
        case ev.JobStarted() | ev.JobResized():
            note = "resized" if isinstance(event, ev.JobResized) else ""
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="started",
                                 note=_join(note, _config(event.configuration.parts)))
        case ev.JobStopped():
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="stopped",
                                 note=event.reason)
        case ev.JobFinished():
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="finished")
        case ev.JobFailed():
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="failed",
                                 note=event.reason)
        case ev.JobCancelled():
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="cancelled",
                                 note=event.reason)
        case ev.JobHeld():
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="held",
                                 note=event.reason)
        case ev.JobReleased():
            return TimelineEntry(job_id=event.job_id, at=event.at, kind="released")
    return None


def _config(parts: Iterable[tuple[str, int]]) -> str:
    return "on " + ", ".join(f"{s}x{g}" for s, g in parts)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def receipt_entry(receipt: Receipt) -> TimelineEntry:
    return TimelineEntry(job_id=receipt.job_id, at=receipt.at, kind="stopped",
                         note=receipt.message, receipt=receipt)


def reason_entries(previous: Mapping[JobId, Why], whys: Mapping[JobId, Why],
                   now: float) -> list[TimelineEntry]:
    """An entry per job whose primary reason's code is new or changed."""
    return [
        TimelineEntry(job_id=k, at=now, kind="reason", note=w.message, why=w)
        for k, w in sorted(whys.items())
        if k not in previous or previous[k].code != w.code
    ]


def forecast_entries(previous: Mapping[JobId, JobForecast], forecast: QueueForecast,
                     round_s: float) -> list[TimelineEntry]:
    """An entry per job forecast for the first time, or whose forecast
    start moved by at least one round."""
    return [
        TimelineEntry(job_id=f.job_id, at=forecast.at, kind="forecast", forecast=f)
        for f in forecast.jobs
        if f.job_id not in previous or abs(previous[f.job_id].start - f.start) >= round_s
    ]


def entry_id(entry: TimelineEntry) -> str:
    """The entry's JetStream message id: the same entry published twice (a
    redelivered event, a retried publish) is stored once."""
    return f"{entry.job_id}:{entry.kind}:{entry.at:.6f}"


# --- the queue view ----------------------------------------------------------------


def fill_queue(view: QueueView, explained: Mapping[JobId, JobExplain]) -> QueueView:
    """``view`` with each entry's reason, positions and forecast from its
    job's ``hops_explain`` record (as the leader holds it: a standby that
    read the bucket answers the same)."""
    if not view.ok:
        return view
    entries = []
    for entry in view.entries:
        e = explained.get(entry.job_id)
        if e is None:
            entries.append(entry)
            continue
        f = e.forecast
        entries.append(msgspec.structs.replace(
            entry, why=e.why, forecast=f, position=f.position if f else 0,
            tenant_position=f.tenant_position if f else 0))
    return msgspec.structs.replace(view, entries=tuple(entries))
