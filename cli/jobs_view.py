"""``hops jobs``: the times of a job as the table shows them, and the orders
``--sort`` lists jobs in, from the gateway's ``GET /jobs`` (each job with
``submitted_at``, ``waited_s``, ``ran_s`` and ``restarts``:
:func:`gateway.views.job_times`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Job = Mapping[str, Any]


def _submitted(job: Job) -> tuple[float, str]:
    return float(job.get("submitted_at", 0.0)), str(job["job_id"])


def _largest(field: str) -> Callable[[Job], tuple[float, float, str]]:
    def key(job: Job) -> tuple[float, float, str]:
        return (-float(job.get(field, 0) or 0), *_submitted(job))

    return key


# Each key of ``--sort``: submitted (the gateway's order) and id list the
# smallest first; waited, ran and restarts the largest first, ties oldest first.
SORTS: dict[str, Callable[[Job], Any]] = {
    "submitted": _submitted,
    "id": lambda job: str(job["job_id"]),
    "waited": _largest("waited_s"),
    "ran": _largest("ran_s"),
    "restarts": _largest("restarts"),
}
SORT_HELP = ("order of the list: " + ", ".join(SORTS)
             + " (submitted and id smallest first, the others largest first)")


def check_sort(by: str) -> str:
    """``by`` if it is a key of :data:`SORTS`; ValueError naming the keys otherwise."""
    if by not in SORTS:
        raise ValueError(f"unknown sort key {by!r}; expected one of: {', '.join(SORTS)}")
    return by


def sort_jobs(jobs: Sequence[Job], by: str) -> list[Job]:
    """``jobs`` in the order of the sort key ``by`` (:func:`check_sort`)."""
    return sorted(jobs, key=SORTS[check_sort(by)])


def duration(seconds: Any) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``1d04h``: two units at most; ``-`` if unknown."""
    if not isinstance(seconds, int | float):
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def when(epoch: Any) -> str:
    """A submission time (seconds since the epoch) in local time, ``MM-DD HH:MM:SS``."""
    if not isinstance(epoch, int | float):
        return "-"
    return time.strftime("%m-%d %H:%M:%S", time.localtime(epoch))


def span(seconds: float) -> str:
    """A stretch of time, short and readable: ``45s``, ``12m``, ``1h05m``,
    ``2d03h`` (:func:`duration`, but whole minutes under an hour)."""
    s = max(0, round(seconds))
    return f"{round(s / 60)}m" if 60 <= s < 3600 else duration(s)


def relative(epoch: float, now: float) -> str:
    """``epoch`` as seen from ``now``: ``in 12m``, ``now`` or ``5m ago``."""
    if abs(epoch - now) < 1:
        return "now"
    return f"in {span(epoch - now)}" if epoch > now else f"{span(now - epoch)} ago"


def _edge(epoch: float, now: float) -> str:
    return "now" if epoch <= now + 0.5 else span(epoch - now)


def estimate(forecast: Mapping[str, Any] | None, which: str, now: float) -> str:
    """A forecast's ``start`` or ``finish`` from ``now`` with its 10th-90th
    percentile interval, e.g. ``in 12m (8m–20m)``; ``-`` without one."""
    if not forecast or not isinstance(forecast.get(which), int | float) or not forecast[which]:
        return "-"
    lo, hi = forecast.get(f"{which}_lo", forecast[which]), forecast.get(f"{which}_hi",
                                                                        forecast[which])
    return f"{relative(forecast[which], now)} ({_edge(lo, now)}–{_edge(hi, now)})"


def reason_of(job: Mapping[str, Any]) -> str:
    """The REASON a listing shows: the plan's reason code (``why``) while
    the job waits, else the record's reason (``held ...``, ``node lost``)."""
    why = job.get("why")
    record = str(job.get("reason") or "")
    if isinstance(why, Mapping) and why.get("code"):
        # a hold by the system names its cause (``unknown_tenant``), as
        # Slurm's JobHeldAdmin differs from JobHeldUser
        cause = record.split(":", 1)[0].strip()
        if why["code"] == "Held" and cause and cause != "held":
            return f"Held ({cause})"
        return str(why["code"])
    return record
