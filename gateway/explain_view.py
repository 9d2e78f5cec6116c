"""The gateway's views of why a job waits, its last stop and its forecast
(``hops_explain``, stream ``HOPS_TIMELINE``: :mod:`shared.explain`), as
whoever asks may see them; pure, :mod:`gateway.explain_routes` is the shell.

A tenant sees only its own jobs, named by their ids; wherever a reason, a
receipt or a timeline entry names another tenant's job, the sentence says
"another tenant's job" and so do the structured fields (``jobs``,
``takers``): no other tenant's id leaves the gateway. An admin sees every
job by its key (``tenant/id``, :mod:`shared.jobkeys`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.conditions import conditions
from gateway.views import jsonable
from shared.explain import (
    ANOTHER_TENANT,
    JobExplain,
    JobForecast,
    Receipt,
    TimelineEntry,
    Why,
    render,
    render_receipt,
)
from shared.ids import JobId
from shared.jobkeys import local_id, split_key
from shared.records import JobRecord, QueueEntry, QueueView
from shared.tenants import DEFAULT_TENANT

# The fields of a Why that are its details (the rest: code, message, layer, since).
_DETAILS = ("jobs", "ratios", "types", "gpu_type", "short", "free", "rank", "window",
            "next_plan_at")


@dataclass(frozen=True)
class Viewer:
    """Who looks: an admin (``tenant`` None) or a tenant; ``tenants`` maps
    job keys to their tenants where the key alone does not tell (a bare key
    written before keys were qualified may be any tenant's)."""

    tenant: str | None = None
    tenants: Mapping[str, str] = field(default_factory=dict)

    def tenant_of(self, key: str) -> str:
        named = split_key(key)[0]
        return self.tenants.get(key, named if named is not None else DEFAULT_TENANT)

    def name(self, key: str) -> str:
        """How the viewer sees job ``key``: an admin by its key, a tenant
        its own by its id and any other as "another tenant's job"."""
        if self.tenant is None:
            return key
        return local_id(key) if self.tenant_of(key) == self.tenant else ANOTHER_TENANT


ADMIN = Viewer()


def _shown(job: JobId) -> bool:
    """Whether a name :meth:`Viewer.name` gave is a job's (not redacted)."""
    return job != ANOTHER_TENANT


def _names(jobs: Iterable[str], viewer: Viewer) -> tuple[JobId, ...]:
    return tuple(JobId(viewer.name(j)) for j in jobs)


def redact(explain: JobExplain, viewer: Viewer) -> JobExplain:
    """``explain`` with every job it names as ``viewer`` sees it."""
    replace = msgspec.structs.replace
    why = explain.why and redact_why(explain.why, viewer)
    receipt = explain.receipt and redact_receipt(explain.receipt, viewer)
    forecast = explain.forecast and replace(explain.forecast,
                                            job_id=JobId(viewer.name(explain.forecast.job_id)))
    return replace(explain, job_id=JobId(viewer.name(explain.job_id)), why=why,
                   receipt=receipt, forecast=forecast)


def redact_why(why: Why, viewer: Viewer) -> Why:
    return msgspec.structs.replace(why, jobs=_names(why.jobs, viewer))


def redact_receipt(receipt: Receipt, viewer: Viewer) -> Receipt:
    return msgspec.structs.replace(receipt, job_id=JobId(viewer.name(receipt.job_id)),
                                   takers=_names(receipt.takers, viewer))


def why_view(why: Why) -> dict[str, Any]:
    """A (redacted) reason: its ``code``, the sentence with the jobs it
    names (``message``), the layer that decided, since when, and the
    details that are set."""
    defaults = Why(code=why.code, message="")
    details = {f: jsonable(getattr(why, f)) for f in _DETAILS
               if getattr(why, f) != getattr(defaults, f)}
    return {"code": why.code, "message": render(why, _shown), "layer": why.layer,
            "since": why.since, "details": details}


def receipt_view(receipt: Receipt) -> dict[str, Any]:
    """A (redacted) receipt, its sentence naming the jobs that took its GPUs."""
    body: dict[str, Any] = jsonable(receipt)
    body["message"] = render_receipt(receipt, _shown)
    return body


def forecast_view(forecast: JobForecast) -> dict[str, Any]:
    body: dict[str, Any] = jsonable(forecast)
    body.pop("job_id", None)
    return body


def _optional(value: Any, view: Any) -> Any:
    return None if value is None else view(value)


def explain_fields(record: JobRecord, explain: JobExplain | None,
                   viewer: Viewer) -> dict[str, Any]:
    """What ``GET /jobs/{id}`` adds to a job's record: ``why``,
    ``receipt``, ``forecast``, ``throughput`` (samples/s, estimated and
    measured; 0: not known) and ``conditions``, as ``viewer`` may see them."""
    shown = redact(explain, viewer) if explain is not None else None
    return {
        "why": _optional(shown and shown.why, why_view),
        "receipt": _optional(shown and shown.receipt, receipt_view),
        "forecast": _optional(shown and shown.forecast, forecast_view),
        "throughput": {
            "estimated": shown.estimated_throughput if shown else 0.0,
            "measured": shown.measured_throughput if shown else 0.0,
        },
        "explained_at": shown.at if shown else None,
        "conditions": [msgspec.to_builtins(c) for c in conditions(record, shown, _shown)],
    }


def list_fields(explain: JobExplain | None, viewer: Viewer) -> dict[str, Any]:
    """What ``GET /jobs`` adds to each job: its ``why`` (None while it runs)."""
    why = explain.why if explain is not None else None
    if why is None:
        return {"why": None}
    return {"why": why_view(redact_why(why, viewer))}


def timeline_view(entries: Iterable[TimelineEntry], viewer: Viewer) -> list[dict[str, Any]]:
    """A job's timeline entries, oldest first, as ``viewer`` may see them.
    Ordered by when each happened (stably): a leader killed between a job
    event and its entry leaves the entry to its successor, which may store
    a later plan's reason first."""
    out = []
    for e in sorted(entries, key=lambda e: e.at):
        why = e.why and redact_why(e.why, viewer)
        receipt = e.receipt and redact_receipt(e.receipt, viewer)
        out.append({"at": e.at, "kind": e.kind, "note": e.note,
                    "why": _optional(why, why_view),
                    "receipt": _optional(receipt, receipt_view),
                    "forecast": _optional(e.forecast, forecast_view)})
    return out


def queue_body(view: QueueView, viewer: Viewer,
               only: Collection[str] | None = None) -> dict[str, Any]:
    """``GET /queue``: the leader's view (the jobs of ``only`` alone: a
    tenant's keys), each entry's job named as ``viewer`` sees it, its
    ``why`` as :func:`why_view` and its ``forecast`` as :func:`forecast_view`."""
    body: dict[str, Any] = jsonable(view)
    body["entries"] = [_queue_entry(e, viewer) for e in view.entries
                       if only is None or e.job_id in only]
    return body


def _queue_entry(entry: QueueEntry, viewer: Viewer) -> dict[str, Any]:
    body: dict[str, Any] = jsonable(entry)
    body["job_id"] = viewer.name(entry.job_id)
    why = entry.why and redact_why(entry.why, viewer)
    body["why"] = _optional(why, why_view)
    body["forecast"] = _optional(entry.forecast, forecast_view)
    return body
