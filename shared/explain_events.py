"""Reasons and receipts on a tenant's event feed (docs/events.md).

The leader republishes each job event of a tenant's jobs on
``hops.v1.tenants.<tenant>.events.<job id>`` (shared.events); each entry of
those jobs' timelines (shared.explain.TimelineEntry: a reason that changed,
a stop's receipt, a forecast that moved) goes there too, as a
:class:`JobExplained`, whose ``type`` tag tells it apart from the job
events. :func:`for_tenant` writes it as the tenant may see it: its own jobs
by the ids it gave them, another tenant's as "another tenant's job" in the
text and left out of the structured fields. :func:`decode_feed` reads
either kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import msgspec

from shared import events as ev
from shared.explain import TimelineEntry, Why, render, render_receipt
from shared.ids import JobId


class JobExplained(ev.Message, frozen=True, tag="job_explained"):
    """One timeline entry of a tenant's job on its feed; ``text`` is its
    reason or receipt in words as the tenant may read them."""

    job_id: JobId
    entry: TimelineEntry
    text: str = ""


FeedMessage: TypeAlias = ev.JobEvent | JobExplained
_FEED: msgspec.json.Decoder[FeedMessage] = msgspec.json.Decoder(FeedMessage)


def decode_feed(data: bytes) -> FeedMessage:
    """A message of a tenant's feed: a job event or a :class:`JobExplained`
    (raises ``msgspec.DecodeError`` otherwise)."""
    return _FEED.decode(data)


def text_of(entry: TimelineEntry, visible: Callable[[JobId], bool] = lambda _: True) -> str:
    """The entry in words: its receipt's or reason's, else its note."""
    if entry.receipt is not None:
        return render_receipt(entry.receipt, visible)
    if entry.why is not None:
        return render(entry.why, visible)
    return entry.note


def for_tenant(entry: TimelineEntry, visible: Callable[[JobId], bool],
               local: Callable[[JobId], JobId]) -> JobExplained:
    """``entry`` as its tenant's feed carries it: the jobs ``visible``
    refuses are "another tenant's job" in ``text`` and absent from the
    reason's and receipt's fields; the others, the job itself included, are
    named by ``local`` (the id the tenant gave them)."""
    why, receipt = entry.why, entry.receipt
    if why is not None:
        kept = [(local(j), r) for j, r in _pairs(why) if visible(j)]
        why = msgspec.structs.replace(
            why, jobs=tuple(j for j, _ in kept),
            ratios=tuple(r for _, r in kept) if why.ratios else ())
    if receipt is not None:
        receipt = msgspec.structs.replace(
            receipt, job_id=local(receipt.job_id),
            takers=tuple(local(j) for j in receipt.takers if visible(j)))
    forecast = entry.forecast
    if forecast is not None:  # its what-ifs name no other job
        forecast = msgspec.structs.replace(forecast, job_id=local(forecast.job_id))
    job_id = local(entry.job_id)
    shown = msgspec.structs.replace(entry, job_id=job_id, why=why, receipt=receipt,
                                    forecast=forecast)
    return JobExplained(job_id=job_id, entry=shown, text=text_of(entry, visible))


def _pairs(why: Why) -> list[tuple[JobId, float]]:
    ratios = why.ratios or (0.0,) * len(why.jobs)
    return list(zip(why.jobs, ratios, strict=False))

