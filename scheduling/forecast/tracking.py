"""The calibration's bookkeeping, one implementation for the simulator and
the live leader (docs/explain.md, "Forecasts").

A forecast is *opened* when it is made (:func:`opened`): for each waiting
job, its uncalibrated start and finish intervals; for a job the plan just
started, its finish interval alone. It is *resolved* when the job starts or
finishes (:func:`resolved`): each open forecast of that quantity leaves its
residual in the :class:`~scheduling.forecast.calibration.Calibration`
(:func:`~scheduling.forecast.calibration.observe`). Residuals are taken on
the intervals as the draws made them, never on calibrated ones, so the
correction does not feed on itself.

A long wait is not left to teach the calibration only when it ends: an
open forecast whose high end has passed is a known miss. :func:`current`
is the calibration with those as provisional residuals (actual = now), for
this round's correction only (:func:`~scheduling.forecast.calibration.with_known_misses`);
:func:`known_misses` moves the adaptive miss levels
(:func:`~scheduling.forecast.calibration.track`) by each interval *as
shown* whose high end passed, once, and :func:`resolved` by the others.

:class:`Tracker` is a msgspec Struct, so the live leader stores it
(:func:`encode`, :func:`decode`); ``per_job`` bounds how many open
forecasts of one job it keeps (the oldest dropped first), and
:func:`kept` drops the jobs that are gone.
"""

from __future__ import annotations

from collections.abc import Collection, Container

import msgspec

from scheduling.forecast.calibration import (
    Calibration,
    Interval,
    Quantity,
    observe,
    track,
    with_known_misses,
)
from shared.explain import QueueForecast
from shared.ids import JobId


class Open(msgspec.Struct, frozen=True, array_like=True):
    """A forecast made at ``at`` not yet resolved: the uncalibrated
    intervals its residuals are taken on; ``record``: the simulator's index
    of the record it made (-1: none)."""

    at: float
    start: Interval
    finish: Interval
    record: int = -1
    # the intervals as shown (calibrated), whose misses move the miss
    # levels; and the quantities already counted as known misses
    shown_start: Interval | None = None
    shown_finish: Interval | None = None
    known: tuple[Quantity, ...] = ()


class Tracker(msgspec.Struct, kw_only=True):
    """The calibration and the open forecasts of each job, oldest first.
    ``per_job``: open forecasts kept per job (0: all)."""

    calibration: Calibration = msgspec.field(default_factory=Calibration)
    open_start: dict[JobId, list[Open]] = msgspec.field(default_factory=dict)
    open_finish: dict[JobId, list[Open]] = msgspec.field(default_factory=dict)
    per_job: int = 0


def _add(opens: dict[JobId, list[Open]], job: JobId, o: Open, per_job: int) -> None:
    row = opens.setdefault(job, [])
    row.append(o)
    if per_job and len(row) > per_job:
        del row[: len(row) - per_job]


def opened(t: Tracker, raw: QueueForecast, started: Container[JobId],
           first_record: int = 0, shown: QueueForecast | None = None) -> list[int]:
    """Open the forecasts of ``raw`` (uncalibrated) in ``t``: every waiting
    job's, and the finish of each running job in ``started`` (the plan
    started it) that has none open. Returns the indices in ``raw.jobs`` of
    the waiting jobs' forecasts, whose records are numbered from
    ``first_record`` in that order. ``shown``: the same forecast calibrated
    (in the same order), whose intervals the miss levels follow."""
    waiting: list[int] = []
    for i, f in enumerate(raw.jobs):
        o = Open(raw.at, Interval(f.start_lo, f.start, f.start_hi, f.position),
                 Interval(f.finish_lo, f.finish, f.finish_hi, f.position))
        if not f.position:
            # A job this plan starts: its finish forecast is one of run time
            # alone, which resolves sooner; it calibrates finishes but is not
            # a waiting job's record.
            if f.job_id in started and f.job_id not in t.open_finish:
                t.open_finish[f.job_id] = [o]
            continue
        o = msgspec.structs.replace(o, record=first_record + len(waiting))
        if shown is not None:
            g = shown.jobs[i]
            o = msgspec.structs.replace(
                o, shown_start=Interval(g.start_lo, g.start, g.start_hi, g.position),
                shown_finish=Interval(g.finish_lo, g.finish, g.finish_hi, g.position))
        waiting.append(i)
        _add(t.open_start, f.job_id, o, t.per_job)
        _add(t.open_finish, f.job_id, o, t.per_job)
    return waiting


def resolved(t: Tracker, job: JobId, now: float, *, finished: bool,
             scale: float) -> list[Open]:
    """``job`` started (or, with ``finished``, finished) at ``now``: its open
    forecasts of that quantity resolved into ``t.calibration`` (``scale``:
    one round). Returns them (none: nothing changed)."""
    done = (t.open_finish if finished else t.open_start).pop(job, [])
    cal = t.calibration
    quantity: Quantity = "finish" if finished else "start"
    for o in done:
        cal = observe(cal, quantity, o.at, o.finish if finished else o.start, now, scale)
        shown = o.shown_finish if finished else o.shown_start
        if shown is not None and quantity not in o.known:
            cal = track(cal, quantity, shown, now)
    t.calibration = cal
    return done


def current(t: Tracker, now: float, scale: float) -> Calibration:
    """The calibration to correct a forecast made at ``now`` with: ``t``'s,
    with every open forecast already known to have missed high as a
    provisional residual. Not stored: the real residual replaces it."""
    starts = ((o.at, o.start) for opens in t.open_start.values() for o in opens)
    finishes = ((o.at, o.finish) for opens in t.open_finish.values() for o in opens)
    cal = with_known_misses(t.calibration, "start", starts, now, scale)
    return with_known_misses(cal, "finish", finishes, now, scale)


def known_misses(t: Tracker, now: float) -> None:
    """Count, once, each open forecast's shown interval whose high end has
    passed with its job still waiting (or running) as the miss it already
    is: the miss levels learn of a long wait while it goes on."""
    cal = t.calibration
    quantities: tuple[tuple[Quantity, dict[JobId, list[Open]]], ...] = (
        ("start", t.open_start), ("finish", t.open_finish))
    for quantity, by_job in quantities:
        for row in by_job.values():
            for k, o in enumerate(row):
                shown = o.shown_start if quantity == "start" else o.shown_finish
                if shown is None or quantity in o.known or shown.hi >= now:
                    continue
                cal = track(cal, quantity, shown, now)
                row[k] = msgspec.structs.replace(o, known=(*o.known, quantity))
    t.calibration = cal


def kept(t: Tracker, jobs: Collection[JobId]) -> bool:
    """Drop the open forecasts of jobs not in ``jobs`` (ended without
    resolving them: cancelled, failed); whether any were dropped."""
    gone = [k for k in (*t.open_start, *t.open_finish) if k not in jobs]
    for k in gone:
        t.open_start.pop(k, None)
        t.open_finish.pop(k, None)
    return bool(gone)


_DECODER = msgspec.json.Decoder(Tracker)


def encode(t: Tracker) -> bytes:
    """``t`` as JSON (what the live leader stores)."""
    return msgspec.json.encode(t)


def decode(data: bytes) -> Tracker:
    """A tracker from :func:`encode` (raises ``msgspec.DecodeError``)."""
    return _DECODER.decode(data)
