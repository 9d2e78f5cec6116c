"""When the live scheduler plans, and what its recent plans still have in flight.

:class:`RoundClock` decides between the three things the leader's loop does
(§3.6): the *first plan* of a round every ``round_s`` seconds (every running
job is replanned), a *fill plan* later in the round when GPUs were released
or a job became plannable (``replan_delay_s`` after the first such event, so
a burst of events shares one plan), and the periodic refresh of the queue's
priorities (every ``refresh_s`` seconds; the paper refreshes every 30 s).
A plan that asks to be followed by another (``Plan.wake_after_s``: CODA's
allocator measures a core change, then decides the next) gets a fill plan
that many seconds later (:meth:`RoundClock.wake_in`), never a round's first
plan: the running jobs are not replanned for it.

:class:`Inflight` remembers what a plan asked for until the placer's work
shows up in ``hops_alloc`` or in the job records, so that the next plan
does not hand the same GPUs out twice or profile a job twice: profiling
tasks until the job's record lists the type as profiled, starts until the
job runs. An entry is dropped ``grace_s`` after it was issued or last seen
booked in ``hops_alloc`` (the placer failed to act on it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Literal

from scheduling.live.state import LiveJobRecord
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.records import Placement
from shared.snapshot import Plan

Due = Literal["first", "fill", "refresh"]
# The shortest wake-up honoured: a layer asking for less cannot make the
# leader plan in a tight loop.
MIN_WAKE_S = 0.1


class RoundClock:
    """Round, fill-plan and refresh timing; see the module docstring."""

    def __init__(
        self, round_s: float, replan_delay_s: float, refresh_s: float, now: float, round_no: int = 0
    ) -> None:
        if round_s <= 0 or refresh_s <= 0 or replan_delay_s < 0:
            raise ValueError("round_s and refresh_s must be > 0, replan_delay_s >= 0")
        self.round_s = round_s
        self.replan_delay_s = replan_delay_s
        self.refresh_s = refresh_s
        self.round = round_no
        self.next_round = now  # a new leader plans at once
        self.requested: float | None = None  # the first replan request not yet served
        # The latest request: one made while a plan was being made outlives
        # that plan, whose snapshot missed it.
        self.latest: float | None = None
        self.wake_at: float | None = None  # when the last plan asked for a next one
        self.next_refresh = now + refresh_s

    @property
    def replan_at(self) -> float | None:
        return None if self.requested is None else self.requested + self.replan_delay_s

    def request_replan(self, now: float) -> None:
        """GPUs were released or a job became plannable: plan again soon."""
        if self.requested is None:
            self.requested = now
        self.latest = now if self.latest is None else max(self.latest, now)

    def wake_in(self, now: float, after_s: float) -> None:
        """The plan made at ``now`` asks for another within ``after_s``
        seconds (0: no need). It replaces any earlier request: the policy's
        latest plan knows what it still needs."""
        self.wake_at = now + max(after_s, MIN_WAKE_S) if after_s > 0 else None

    def due(self, now: float) -> Due | None:
        if now >= self.next_round:
            return "first"
        replan_at = self.replan_at
        if replan_at is not None and now >= replan_at:
            return "fill"
        if self.wake_at is not None and now >= self.wake_at:
            return "fill"
        if now >= self.next_refresh:
            return "refresh"
        return None

    def done(self, what: Due, started: float) -> None:
        """``what``, which began at ``started``, is done; a first plan starts
        round ``round``. Requests made while a plan was being made stay due."""
        if what == "first":
            self.round += 1
            self.next_round = started + self.round_s
        if what != "refresh" and self.requested is not None and self.requested <= started:
            # served, but not a request made after the plan's snapshot was taken
            if self.latest is not None and self.latest > started:
                self.requested = self.latest
            else:
                self.requested = self.latest = None
        if what != "refresh" and self.wake_at is not None and self.wake_at <= started:
            self.wake_at = None  # served (or the plan failed: the next round replans)
        self.next_refresh = started + self.refresh_s

    def sleep_s(self, now: float) -> float:
        """Seconds until something is due."""
        times = [self.next_round, self.next_refresh]
        times += [t for t in (self.replan_at, self.wake_at) if t is not None]
        return max(0.0, min(times) - now)


class Inflight:
    """Plans issued but not yet visible; see the module docstring."""

    def __init__(self, grace_s: float, max_attempts: int = 3) -> None:
        self.grace_s = grace_s
        self.max_attempts = max_attempts
        self.profiling: dict[tuple[JobId, GpuType], tuple[ServerId, float]] = {}
        self.starts: dict[JobId, tuple[Configuration, float]] = {}
        self.failed: Counter[tuple[JobId, GpuType]] = Counter()

    def note_plan(
        self, plan: Plan, now: float, first: bool, running: Mapping[JobId, Configuration]
    ) -> None:
        """Remember ``plan``'s profiling tasks and its starts of jobs that do not
        already run as planned. A first plan supersedes earlier starts."""
        if first:
            self.starts.clear()
        for task in plan.profiling:
            self.profiling[(task.job_id, task.gpu_type)] = (task.server, now)
        for a in plan.assignments:
            if running.get(a.job_id) != a.config:
                self.starts[a.job_id] = (a.config, now)

    def settle(
        self,
        records: Mapping[JobId, LiveJobRecord],
        allocs: Mapping[JobId, Placement],
        now: float,
    ) -> None:
        """Drop what became visible, what no longer matters and what expired."""
        for key, (server, at) in list(self.profiling.items()):
            job_id, gpu_type = key
            rec = records.get(job_id)
            if rec is None or rec.final or gpu_type in rec.profiled:
                del self.profiling[key]
                continue
            alloc = allocs.get(job_id)
            if (
                alloc is not None
                and alloc.mode == "profile"
                and server in alloc.configuration.servers
            ):
                self.profiling[key] = (server, now)  # booked and running: keep waiting
            elif now - at > self.grace_s:
                del self.profiling[key]
                self.failed[key] += 1
        for job_id, (_, at) in list(self.starts.items()):
            rec = records.get(job_id)
            alloc = allocs.get(job_id)
            booked = alloc is not None and alloc.mode == "run"
            gone = rec is None or rec.final or rec.phase == "running"
            if gone or booked or now - at > self.grace_s:
                del self.starts[job_id]

    def given_up(self, job_id: JobId) -> set[GpuType]:
        """GPU types the job could not be profiled on in ``max_attempts``
        tries (say, its model does not fit them): it is planned without them."""
        return {t for (j, t), n in self.failed.items() if j == job_id and n >= self.max_attempts}

    def profiling_types(self, job_id: JobId) -> set[GpuType]:
        return {t for (j, t) in self.profiling if j == job_id}

    def unbooked_profiling(self, allocs: Mapping[JobId, Placement]) -> Counter[ServerId]:
        """GPUs (one per task) of profiling tasks not yet booked in ``hops_alloc``."""
        out: Counter[ServerId] = Counter()
        for (job_id, _), (server, _) in self.profiling.items():
            alloc = allocs.get(job_id)
            if alloc is None or server not in alloc.configuration.servers:
                out[server] += 1
        return out
