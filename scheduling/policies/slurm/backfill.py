"""EASY backfill over whole-GPU, rigid requests (Lifka, "The ANL/IBM SP
scheduling system", JSSPP'95; Mu'alem and Feitelson, IEEE TPDS 12(6), 2001;
Slurm's ``sched/backfill``).

The queue is walked in priority order. Jobs start while they fit. The first
job that does not fit (the head) gets a *reservation*: the earliest time
``shadow`` at which enough GPUs will be free for it, computed from the
running jobs' time limits, and the GPUs it would take then. A later job may
start now only if it fits now and does not delay that reservation: it ends
by ``shadow`` (by its own time limit), or it uses only GPUs the
reservation leaves over at ``shadow`` (the "extra" GPUs). Only the head
holds a reservation (EASY; conservative backfill reserves for every job).
The rule itself (the shadow time, what may start before it) is
:mod:`scheduling.backfill`, which Hops' ``reserve_head`` applies too.

Pure: times are numbers the caller gives, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduling.backfill import ends_by, shadow
from scheduling.backfill import spare as backfill_spare
from scheduling.policies.rigid import Avail, take
from shared.configuration import Configuration
from shared.ids import JobId, ServerId

# Where a job's GPUs would go among free GPUs (None: no room).
Placer = Callable[["Waiting", Avail], Configuration | None]


@dataclass(frozen=True)
class Running:
    """A job holding ``config`` until ``end`` (now + what its limit leaves)."""

    job_id: JobId
    config: Configuration
    end: float


@dataclass(frozen=True)
class Waiting:
    """A queued job: ``limit_s`` is its time limit (seconds of running)."""

    job_id: JobId
    gpus: int
    limit_s: float


@dataclass(frozen=True)
class Reservation:
    """The head's GPUs ``config`` from time ``start`` on."""

    job_id: JobId
    start: float
    config: Configuration


@dataclass
class Outcome:
    """What one pass started, and the reservation it made (None: every job
    that could ever run fitted, or the head can never run)."""

    started: dict[JobId, Configuration] = field(default_factory=dict)
    backfilled: list[JobId] = field(default_factory=list)
    reservation: Reservation | None = None


def reserve(job: Waiting, avail: Avail, running: Sequence[Running], now: float,
            placer: Placer) -> tuple[Reservation, Avail] | None:
    """The earliest time ``job`` fits as the running jobs end (in the order
    of their ends, then of their ids), its GPUs then, and the free GPUs at
    that time; None if it fits not even once every running job ended."""
    def fit(free: Mapping[ServerId, int]) -> Configuration | None:
        if sum(free.values()) < job.gpus:
            return None  # no placement before this many GPUs are free
        return placer(job, dict(free))

    ordered = sorted(running, key=lambda r: (r.end, r.job_id))
    found = shadow(avail, [(r.end, r.config.parts) for r in ordered], now, fit)
    if found is None:
        return None
    return Reservation(job.job_id, found.start, found.fit), found.free


def easy_backfill(queue: Sequence[Waiting], avail: Avail, running: Sequence[Running],
                  now: float, placer: Placer, backfill: bool = True) -> Outcome:
    """One scheduling pass over ``queue`` (highest priority first) on the
    free GPUs ``avail``, with ``running`` the jobs that hold the rest.
    Without ``backfill`` the pass stops at the first job that does not fit
    (strict priority order, Slurm's ``sched/builtin``)."""
    avail = dict(avail)
    ends = list(running)
    out = Outcome()
    spare: Avail = {}  # GPUs free now and still free at the shadow time beyond the head's
    future: Avail = {}
    for job in queue:
        res = out.reservation
        if res is None:
            config = placer(job, avail)
            if config is not None:
                _start(out, job, config, avail, ends, now)
                continue
            made = reserve(job, avail, ends, now, placer)
            if made is None:
                continue  # it can never run here: it blocks nobody
            if not backfill:
                break
            out.reservation, future = made
            spare = backfill_spare(avail, future, out.reservation.config.parts)
            continue
        short = ends_by(now, job.limit_s, res.start)
        config = placer(job, avail if short else spare)
        if config is None:
            continue
        _start(out, job, config, avail, ends, now)
        out.backfilled.append(job.job_id)
        if not short:
            take(future, config)  # it still holds them at the shadow time
        spare = backfill_spare(avail, future, res.config.parts)
    return out


def _start(out: Outcome, job: Waiting, config: Configuration, avail: Avail,
           ends: list[Running], now: float) -> None:
    out.started[job.job_id] = config
    take(avail, config)
    ends.append(Running(job.job_id, config, now + job.limit_s))

