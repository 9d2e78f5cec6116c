"""The figures of a burst of submissions while long jobs run, and the
targets they are held to (issue: "a burst without churn and without idle
GPUs"); pure, so that the bench (:mod:`bench.live_burst`) and the reduced
live test (``tests/test_live_burst.py``) compute them alike.

A poll of the jobs' records and the GPU bookings is a :class:`Poll`; the
figures are:

- the longest time a burst job took to leave ``submitted`` and
  ``profiling`` (its wall time from the first submission);
- booked GPUs (training and profiling alike) as a share of the cluster,
  averaged over the rounds of the burst in which a job that fits waited at
  some poll: the round's mean over its polls, then the mean over those
  rounds. A job fits when it is ``queued``, not held, and its smallest
  requirement is at most the GPUs nobody books on one server of a type it
  was profiled on (one server: a job that fits only across servers depends
  on its sensitivity, §3.4, and is not counted). The mean over only the
  polls at which such a job waited is printed beside it: it catches the
  instants between a release and the next start (the control loop's
  reaction, about a second live), which a round's mean weighs by their
  length;
- each long job's restarts during the burst (``JobRecord.restarts`` at the
  end less at the start), and whether any long job failed;
- the p99 of the submissions' acknowledgement times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.ids import GpuType, ServerId
from shared.records import JobRecord

PAST_PROFILING_S = 180.0  # every burst job past profiling within 3 minutes
BOOKED_SHARE = 0.90  # of the GPUs booked while a job that fits waits
LONG_RESTARTS = 2  # per long job during the burst
SUBMIT_P99_MS = 50.0
PROFILING = ("submitted", "profiling")


def smallest(rec: JobRecord) -> int:
    """The fewest GPUs ``rec``'s job can run on."""
    spec = rec.spec
    if spec.requirements:
        return min(spec.requirements)
    return spec.min_gpus or 1


def fitting_waits(records: Mapping[str, JobRecord], free: Mapping[GpuType, int]) -> list[str]:
    """The queued jobs, not held, that would fit the GPUs nobody books on
    one server (``free``: the most such GPUs on one server, by type) of a
    type they were profiled on."""
    return sorted(
        job
        for job, r in records.items()
        if r.phase == "queued"
        and not r.held
        and r.spec.kind == "gpu"
        and any(smallest(r) <= free.get(t, 0) for t in r.profiled)
    )


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass
class BurstFigures:
    """What the polls of one burst add up to."""

    servers: Mapping[ServerId, tuple[GpuType, int]]  # each server's type and GPUs
    burst: frozenset[str]
    longs: frozenset[str]
    start_restarts: dict[str, int] = field(default_factory=dict)
    past_profiling: dict[str, float] = field(default_factory=dict)  # job: seconds
    round_s: float = 10.0  # the leader's round, wall seconds
    booked_while_waiting: list[float] = field(default_factory=list)  # shares
    # Per round: the booked shares of its polls, and whether a fitting job waited.
    rounds: dict[int, tuple[list[float], bool]] = field(default_factory=dict)
    # Each such poll: seconds, GPUs free per type on one server at most, who waited.
    waits: list[tuple[float, dict[GpuType, int], list[str]]] = field(default_factory=list)
    end_restarts: dict[str, int] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    longs_running: list[int] = field(default_factory=list)  # per poll
    submit_ms: list[float] = field(default_factory=list)

    def begin(self, records: Mapping[str, JobRecord]) -> None:
        self.start_restarts = {j: records[j].restarts for j in self.longs if j in records}

    @property
    def total_gpus(self) -> int:
        return sum(g for _, g in self.servers.values())

    def poll(
        self, elapsed_s: float, records: Mapping[str, JobRecord], booked: Mapping[ServerId, int]
    ) -> None:
        """One look at the records and the GPUs booked per server,
        ``elapsed_s`` after the first submission of the burst."""
        for job in self.burst:
            rec = records.get(job)
            if rec is not None and rec.phase not in PROFILING:
                self.past_profiling.setdefault(job, elapsed_s)
        free: dict[GpuType, int] = {}
        for sid, (gpu_type, gpus) in self.servers.items():
            free[gpu_type] = max(free.get(gpu_type, 0), gpus - booked.get(sid, 0))
        waiting = fitting_waits(records, free)
        share = sum(booked.values()) / self.total_gpus
        shares, waited = self.rounds.get(int(elapsed_s // self.round_s), ([], False))
        self.rounds[int(elapsed_s // self.round_s)] = ([*shares, share], waited or bool(waiting))
        if waiting:
            self.booked_while_waiting.append(share)
            self.waits.append(
                (round(elapsed_s, 1), free, [f"{j}: {records[j].reason}" for j in waiting[:3]])
            )
        self.longs_running.append(
            sum(1 for j in self.longs if (r := records.get(j)) is not None and r.phase == "running")
        )
        for job in self.longs:
            rec = records.get(job)
            if rec is not None:
                self.end_restarts[job] = rec.restarts
                if rec.phase == "failed":
                    self.failed.add(job)

    def all_past_profiling(self) -> bool:
        return len(self.past_profiling) == len(self.burst)

    def restarts(self) -> dict[str, int]:
        return {j: self.end_restarts.get(j, 0) - self.start_restarts.get(j, 0) for j in self.longs}

    def booked_share(self) -> float:
        """Mean booked share over the rounds in which a fitting job waited
        (1.0 when none did: no GPU idled while work could use it)."""
        means = [sum(s) / len(s) for s, waited in self.rounds.values() if waited and s]
        return sum(means) / len(means) if means else 1.0

    def booked_at_waits(self) -> float:
        """Mean booked share over only the polls at which a fitting job waited."""
        shares = self.booked_while_waiting
        return sum(shares) / len(shares) if shares else 1.0

    def idle_by_type(self) -> dict[str, float]:
        """Mean over the waiting polls of the free GPUs on one server, by type."""
        totals: dict[str, float] = {}
        for _, free, _ in self.waits:
            for t, g in free.items():
                totals[t] = totals.get(t, 0.0) + g
        return {t: round(g / len(self.waits), 1) for t, g in sorted(totals.items())}

    def misses(self) -> list[str]:
        """Each target missed, in words; empty when every one is met."""
        out: list[str] = []
        slowest = max(self.past_profiling.values(), default=math.inf)
        if not self.all_past_profiling():
            out.append(f"{len(self.burst) - len(self.past_profiling)} burst jobs never "
                       "got past profiling")
        elif slowest > PAST_PROFILING_S:
            out.append(f"the last burst job got past profiling after {slowest:.0f} s "
                       f"(target {PAST_PROFILING_S:.0f} s)")
        if self.booked_share() < BOOKED_SHARE:
            out.append(f"booked {self.booked_share():.0%} of the GPUs while a fitting job "
                       f"waited (target {BOOKED_SHARE:.0%})")
        worst = {j: n for j, n in self.restarts().items() if n > LONG_RESTARTS}
        if worst:
            out.append(f"long jobs restarted more than {LONG_RESTARTS} times: {worst}")
        if self.failed:
            out.append(f"long jobs failed: {sorted(self.failed)}")
        if self.submit_ms and p99(self.submit_ms) > SUBMIT_P99_MS:
            out.append(f"submissions acknowledged at p99 {p99(self.submit_ms):.1f} ms "
                       f"(target {SUBMIT_P99_MS:.0f} ms)")
        return out

    def lines(self) -> list[str]:
        """The figures, one per line, each with its target."""
        slowest = max(self.past_profiling.values(), default=math.nan)
        restarts = self.restarts()
        return [
            f"burst jobs past profiling: {len(self.past_profiling)}/{len(self.burst)}, the last "
            f"after {slowest:.1f} s (target <= {PAST_PROFILING_S:.0f} s)",
            f"booked GPUs while a fitting job waited: {self.booked_share():.1%} over "
            f"{sum(1 for _, w in self.rounds.values() if w)} rounds of {self.round_s:g} s "
            f"(target >= {BOOKED_SHARE:.0%}); at the {len(self.booked_while_waiting)} polls "
            f"where one waited: {self.booked_at_waits():.1%}",
            f"long jobs' restarts during the burst: most {max(restarts.values(), default=0)}, "
            f"{dict(sorted(restarts.items()))} (target <= {LONG_RESTARTS}); "
            f"failed {len(self.failed)}; running at once: fewest "
            f"{min(self.longs_running, default=0)} of {len(self.longs)}, mean "
            f"{sum(self.longs_running) / max(1, len(self.longs_running)):.1f}",
            f"idle GPUs on the emptiest server of each type while a fitting job waited, "
            f"mean: {self.idle_by_type()}",
            f"submissions acknowledged: p99 {p99(self.submit_ms):.1f} ms over "
            f"{len(self.submit_ms)} (target <= {SUBMIT_P99_MS:.0f} ms)",
        ]
