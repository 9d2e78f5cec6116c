"""Per-job time limits (Slurm's ``--time``, reason ``TimeLimit``): which
running jobs are over their limit at ``now``, and when the next one will be.

A job's ``time_limit`` (:class:`shared.job.JobSpec`) counts wall seconds
spent ``running``, every run summed: the ``run_s`` its record has closed
(:func:`.state.close_phase`) plus the current run since ``since``. Time
spent profiling, queued, or back in the queue after a preemption is not
counted, so a preempted job is not stopped for time it did not run (Slurm
counts elapsed run time too). The leader (``services.scheduler.timelimits``)
ends a job over its limit with a ``job_cancelled`` of reason ``TimeLimit``,
which the monitor turns into a checkpointing stop (SIGTERM) and a release,
like a user's cancel. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import NamedTuple

from scheduling.live.state import LiveJobRecord
from shared.ids import JobId


class Limits(NamedTuple):
    """``over``: the running jobs at or past their limit, in id order;
    ``next_in``: seconds until the next running job reaches its limit
    (``None``: none will)."""

    over: tuple[JobId, ...]
    next_in: float | None


def running_s(rec: LiveJobRecord, now: float) -> float:
    """Seconds ``rec``'s job has run as of ``now``, every run summed."""
    current = max(0.0, now - rec.since) if rec.phase == "running" else 0.0
    return rec.run_s + current


def limits(records: Iterable[LiveJobRecord], now: float,
           ended: Set[JobId] = frozenset()) -> Limits:
    """The running jobs with a ``time_limit`` that have run for it at ``now``,
    leaving out ``ended`` (jobs already being ended), and the time to the
    next limit among the others."""
    over: list[JobId] = []
    left: list[float] = []
    for rec in records:
        limit = rec.spec.time_limit
        if limit is None or rec.phase != "running" or rec.job_id in ended:
            continue
        remaining = limit - running_s(rec, now)
        if remaining <= 0:
            over.append(rec.job_id)
        else:
            left.append(remaining)
    return Limits(tuple(sorted(over)), min(left) if left else None)
