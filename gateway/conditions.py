"""A job's Kubernetes-style conditions, derived from its ``hops_jobs``
record and the leader's ``hops_explain`` entry alone (pure; docs/explain.md,
"Where to look").

Each condition says one thing about the job with a ``status`` of ``True``,
``False`` or ``Unknown``, a stable ``reason`` code, a sentence and ``since``
(epoch seconds) when it last changed, as far as the record tells:

==============  =====================================================================
type            True when
==============  =====================================================================
``Submitted``   always (admission accepted the job)
``Profiled``    it has a profile on some GPU type, or it has run (False while it is
                profiling: reason ``Profiling``)
``Scheduled``   it runs, or ran and ended; False with the plan's reason code while it
                waits (``Priority``, ``Resources``, ``Held`` ...)
``Running``     it runs now
``Preempted``   a running job was stopped and has not run since; the reason is the
                receipt's rule (``Fairness``, ``CellReclaim``, ``Drain`` ...)
``Finished``    it completed all its samples
``Failed``      it failed (a cancelled job is neither finished nor failed: reason
                ``Cancelled`` on both)
==============  =====================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeAlias

import msgspec

from shared.explain import JobExplain, render, render_receipt
from shared.ids import JobId
from shared.records import FINAL_PHASES, JobRecord

Status: TypeAlias = Literal["True", "False", "Unknown"]
CONDITION_TYPES = ("Submitted", "Profiled", "Scheduled", "Running", "Preempted", "Finished",
                   "Failed")
_WAITING = frozenset({"submitted", "profiling", "queued"})


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    """One condition of a job (see the module docstring)."""

    type: str
    status: Status
    reason: str
    message: str = ""
    since: float = 0.0


Visible = Callable[[JobId], bool]


def conditions(record: JobRecord, explain: JobExplain | None,
               visible: Visible = lambda _: True) -> list[Condition]:
    """The job's conditions in the order of :data:`CONDITION_TYPES`; a job
    ``visible`` refuses is named "another tenant's job" in messages
    (:func:`shared.explain.render`)."""
    return [
        Condition(type="Submitted", status="True", reason="Submitted",
                  message="admission accepted the job", since=record.submitted_at),
        _profiled(record, explain),
        _scheduled(record, explain, visible),
        _running(record, explain),
        _preempted(record, explain, visible),
        *_ended(record),
    ]


def started_at(record: JobRecord, explain: JobExplain | None) -> float:
    """When a running job last started: its forecast's start (a running
    job's is when it started), else its first start."""
    if explain is not None and explain.forecast is not None and explain.forecast.start > 0:
        return explain.forecast.start
    return record.first_start or record.submitted_at


def _profiled(record: JobRecord, explain: JobExplain | None) -> Condition:
    why = explain.why if explain is not None else None
    if why is not None and why.code == "Profiling":
        return Condition(type="Profiled", status="False", reason="Profiling",
                         message=why.message, since=why.since or explain_at(explain))
    if record.profiled or record.first_start is not None:
        types = ", ".join(record.profiled)
        message = f"profiled on {types}" if types else "it has run"
        return Condition(type="Profiled", status="True", reason="Profiled", message=message)
    if record.phase == "profiling":
        return Condition(type="Profiled", status="False", reason="Profiling",
                         message="its profiling runs have not all reported")
    return Condition(type="Profiled", status="Unknown", reason="NotProfiled",
                     message="no profile yet")


def explain_at(explain: JobExplain | None) -> float:
    """When the leader wrote ``explain`` (0: no entry)."""
    return explain.at if explain is not None else 0.0


def _scheduled(record: JobRecord, explain: JobExplain | None, visible: Visible) -> Condition:
    if record.phase == "running":
        return Condition(type="Scheduled", status="True", reason="Scheduled",
                         message="a plan gave it GPUs", since=started_at(record, explain))
    if record.phase in FINAL_PHASES:
        ran = record.first_start is not None
        return Condition(type="Scheduled", status="True" if ran else "False",
                         reason="Scheduled" if ran else _title(record.phase),
                         message="it ran" if ran else f"it {record.phase} before it ran",
                         since=record.first_start or record.finished_at or 0.0)
    why = explain.why if explain is not None else None
    if why is not None:
        return Condition(type="Scheduled", status="False", reason=why.code,
                         message=render(why, visible), since=why.since or explain_at(explain))
    if record.held:
        return Condition(type="Scheduled", status="False", reason="Held",
                         message=record.reason or "a user holds it")
    return Condition(type="Scheduled", status="False", reason="Pending",
                     message=record.reason or "no plan has given a reason yet",
                     since=record.submitted_at)


def _running(record: JobRecord, explain: JobExplain | None) -> Condition:
    if record.phase == "running":
        return Condition(type="Running", status="True", reason="Running",
                         message="it runs", since=started_at(record, explain))
    if record.phase in FINAL_PHASES:
        return Condition(type="Running", status="False", reason=_title(record.phase),
                         message=record.reason or f"it {record.phase}",
                         since=record.finished_at or 0.0)
    stopped = explain is not None and explain.receipt is not None
    return Condition(type="Running", status="False",
                     reason="Stopped" if stopped else "Waiting",
                     message="it waits to run again" if stopped else "it waits to start",
                     since=explain.receipt.at if explain and explain.receipt else 0.0)


def _preempted(record: JobRecord, explain: JobExplain | None, visible: Visible) -> Condition:
    receipt = explain.receipt if explain is not None else None
    if receipt is None:
        return Condition(type="Preempted", status="False", reason="NotPreempted",
                         message="it has not been stopped")
    if record.phase in _WAITING:
        return Condition(type="Preempted", status="True", reason=receipt.rule,
                         message=render_receipt(receipt, visible), since=receipt.at)
    if record.phase == "running":
        return Condition(type="Preempted", status="False", reason="Resumed",
                         message="it runs again", since=started_at(record, explain))
    return Condition(type="Preempted", status="False", reason=_title(record.phase),
                     message=f"it {record.phase}", since=record.finished_at or 0.0)


def _ended(record: JobRecord) -> tuple[Condition, Condition]:
    at = record.finished_at or 0.0
    message = record.reason or f"it {record.phase}"
    if record.phase == "finished":
        return (Condition(type="Finished", status="True", reason="Finished",
                          message="it completed all its samples", since=at),
                Condition(type="Failed", status="False", reason="Finished",
                          message="it completed", since=at))
    if record.phase == "failed":
        return (Condition(type="Finished", status="False", reason="Failed", message=message,
                          since=at),
                Condition(type="Failed", status="True", reason="Failed", message=message,
                          since=at))
    if record.phase == "cancelled":
        return (Condition(type="Finished", status="False", reason="Cancelled",
                          message=message, since=at),
                Condition(type="Failed", status="False", reason="Cancelled",
                          message=message, since=at))
    return (Condition(type="Finished", status="False", reason="NotFinished",
                      message="it has not ended"),
            Condition(type="Failed", status="False", reason="NotFailed",
                      message="it has not ended"))


def _title(phase: str) -> str:
    """A phase as a reason code: ``Finished``, ``Failed``, ``Cancelled``."""
    return phase.capitalize()
