"""The measured throughput of running jobs, for ``JobState.throughput`` (pure).

CODA's adaptive CPU allocator (§V-B-2) changes a running job's cores and
keeps the change when the job got faster, so the policy needs, for every
running job, how fast it went *since its configuration last changed*.

The measure is the job's own progress: every ``job_heartbeat`` carries the
cumulative ``samples_done`` and the time it was taken, for GPU and CPU
jobs alike (a CPU job's samples are its core-seconds of work), whereas a
``sample_reported`` is per GPU and names a GPU type. A job's throughput is
its progress over the window divided by the window's length, the mean rate
over every heartbeat taken at or after ``throughput_since`` (the last
:data:`MAX_BEATS` of them, so a long run is measured over its recent past).
Fewer than two such heartbeats, or none a moment apart, measure nothing (0).

``throughput_since`` is when the job's current configuration took effect:
its record's ``since`` (``job_started`` or ``job_resized``), or later when a
plan changed its cores in place (same GPUs, no restart) and the leader
published that (:meth:`Throughputs.changed`), so that samples taken at the
old core count do not count for the new one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from shared.configuration import Configuration
from shared.ids import JobId
from shared.snapshot import Plan

# Heartbeats kept per job: at the default heartbeat period (1 s) a few
# minutes, many times CODA's sampling period.
MAX_BEATS = 256


class Beat(NamedTuple):
    at: float  # when the job took it (its own clock)
    done: float  # cumulative samples done


class Measured(NamedTuple):
    throughput: float  # samples/s over the window; 0: not measured yet
    since: float  # when the window may start: the configuration's start


def rate(beats: Iterable[Beat]) -> float:
    """Mean samples/s from the first beat to the last (0 with fewer than two
    beats apart in time, or progress that went back)."""
    window = list(beats)
    if len(window) < 2:
        return 0.0
    first, last = window[0], window[-1]
    span = last.at - first.at
    if span <= 0.0 or last.done < first.done:
        return 0.0
    return (last.done - first.done) / span


def in_place(plan: Plan, running: Mapping[JobId, Configuration]) -> tuple[JobId, ...]:
    """The running jobs ``plan`` changes in place: same GPUs on the same
    servers, other cores or memory (``Plan.wake_after_s``)."""
    out = []
    for a in plan.assignments:
        now = running.get(a.job_id)
        if now is not None and now != a.config and now.parts == a.config.parts:
            out.append(a.job_id)
    return tuple(out)


class Throughputs:
    """Each running job's recent heartbeats; see the module docstring."""

    def __init__(self, max_beats: int = MAX_BEATS) -> None:
        if max_beats < 2:
            raise ValueError("max_beats must be >= 2: a rate needs two heartbeats")
        self.max_beats = max_beats
        self.beats: dict[JobId, deque[Beat]] = {}
        self.changes: dict[JobId, float] = {}

    def note(self, job_id: JobId, at: float, done: float) -> None:
        """A heartbeat; one not newer than the last kept (redelivered, or
        another server's beat of the same job) is left out."""
        beats = self.beats.setdefault(job_id, deque(maxlen=self.max_beats))
        if beats and at <= beats[-1].at:
            return
        beats.append(Beat(at, done))

    def changed(self, job_id: JobId, at: float) -> None:
        """A plan published at ``at`` changed the job's cores in place."""
        self.changes[job_id] = max(at, self.changes.get(job_id, 0.0))

    def measured(self, job_id: JobId, started: float) -> Measured:
        """The job's throughput since its configuration took effect, which
        its record says was at ``started`` (see the module docstring)."""
        since = max(started, self.changes.get(job_id, 0.0))
        window = [b for b in self.beats.get(job_id, ()) if b.at >= since]
        return Measured(rate(window), since)

    def keep(self, job_ids: Iterable[JobId]) -> None:
        """Forget every job but ``job_ids`` (the running ones)."""
        keep = set(job_ids)
        self.beats = {j: b for j, b in self.beats.items() if j in keep}
        self.changes = {j: t for j, t in self.changes.items() if j in keep}
