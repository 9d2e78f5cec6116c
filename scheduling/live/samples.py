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

The same heartbeats measure what a restart costs the job (``JobState.
restart_s``, read by Sia's restart factor and Hops' reconfiguration cost):
the time from a start (the record's ``since``) to the first heartbeat that
shows progress beyond the first one after it, the mean of the last
:data:`RESTARTS_KEPT` starts. The heartbeat's time is the job's clock and
``since`` the placer's, so hosts are assumed in step (NTP); because they
may not be, each measurement is bounded by :data:`MAX_RESTART_S`. An
unbounded one (a clock hours apart) would exempt the job from preemption
for ten times that long and saturate its reconfiguration cost.

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

from scheduling.rounds import ROUND_S
from shared.configuration import Configuration
from shared.ids import JobId
from shared.snapshot import Plan

# Heartbeats kept per job: at the default heartbeat period (1 s) a few
# minutes, many times CODA's sampling period.
MAX_BEATS = 256
RESTARTS_KEPT = 8  # starts a job's restart cost is averaged over
JOBS_KEPT = 4096  # jobs whose restart costs are remembered while not running
# Longest restart cost one start may record: two rounds. Sia's slowest
# measured restart is 250 s (world/restarts.py); a longer one is a skewed
# clock or a stall, and past a round the reconfiguration cost is saturated.
MAX_RESTART_S = 2.0 * ROUND_S


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
        # Per job: the starts measured (their ``since``) and the costs.
        self.restarts: dict[JobId, dict[float, float]] = {}

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
        self._restart(job_id, started)
        return Measured(rate(window), since)

    def _restart(self, job_id: JobId, started: float) -> None:
        """Measure the start at ``started`` once its progress shows."""
        seen = self.restarts.get(job_id, {})
        if started in seen:
            return
        after = [b for b in self.beats.get(job_id, ()) if b.at >= started]
        moved = next((b for b in after if b.done > after[0].done), None) if after else None
        if moved is None:
            return
        costs = self.restarts.pop(job_id, {})  # to the end: the most recently measured
        costs[started] = min(MAX_RESTART_S, moved.at - started)
        self.restarts[job_id] = dict(list(costs.items())[-RESTARTS_KEPT:])
        if len(self.restarts) > JOBS_KEPT:
            del self.restarts[next(iter(self.restarts))]

    def restart_s(self, job_id: JobId) -> float:
        """The job's measured restart cost, s (0: not measured yet)."""
        costs = self.restarts.get(job_id)
        return sum(costs.values()) / len(costs) if costs else 0.0

    def keep(self, job_ids: Iterable[JobId]) -> None:
        """Forget every job but ``job_ids`` (the running ones)."""
        keep = set(job_ids)
        self.beats = {j: b for j, b in self.beats.items() if j in keep}
        self.changes = {j: t for j, t in self.changes.items() if j in keep}
