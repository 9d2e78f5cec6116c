"""Where the leader's task pass spends its wall time (docs/hare.md,
"Sim–live parity": the live loop's turnaround per round is a report's
trip, a leader pass and a revision's trip; this measures the middle one).

A :class:`PassTimes` takes a lap at the end of each step of a pass; a
pass that sent a new revision is kept, and every ``every`` kept passes
:meth:`PassTimes.end` returns their summary (:func:`summary`: the median
and p95 of each step and of the whole, in milliseconds), which the task
loop logs. A pass that did not replan (a resend, a report counted ahead of
its round's end) is not the turnaround and is dropped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from structlog.typing import FilteringBoundLogger

TOTAL = "total"


class PassTimes:
    """The laps of the current pass and the passes kept since the last summary."""

    def __init__(self, every: int = 50, clock: Callable[[], float] = time.perf_counter) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.clock = every, clock
        self.began = self.last = clock()
        self.laps: dict[str, float] = {}
        self.kept: list[dict[str, float]] = []

    def begin(self) -> None:
        """A new pass: the laps so far are forgotten."""
        self.began = self.last = self.clock()
        self.laps = {}

    def lap(self, step: str) -> None:
        """The time since the last lap (or the pass's start) goes to ``step``;
        a step timed twice in one pass adds up."""
        now = self.clock()
        self.laps[step] = self.laps.get(step, 0.0) + now - self.last
        self.last = now

    def end(self, replanned: bool, log: FilteringBoundLogger | None = None
            ) -> dict[str, tuple[float, float]] | None:
        """Close the pass (kept when ``replanned``, its laps logged at debug);
        the summary of the kept passes once there are ``every`` of them (then
        they are forgotten), logged at info."""
        if not replanned:
            return None
        laps = {**self.laps, TOTAL: self.clock() - self.began}
        self.kept.append(laps)
        if log is not None:
            log.debug("task pass timed", ms={k: round(1e3 * v, 2) for k, v in laps.items()})
        if len(self.kept) < self.every:
            return None
        kept, self.kept = self.kept, []
        out = summary(kept)
        if log is not None:
            log.info("task pass times", passes=len(kept),
                     ms_median_p95={k: list(v) for k, v in out.items()})
        return out


def summary(passes: Sequence[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Per step (a step a pass did not take counts 0 there), the median and
    the p95 (nearest rank) over ``passes``, in milliseconds, rounded to 0.1."""
    steps = sorted({s for p in passes for s in p}, key=lambda s: (s == TOTAL, s))
    out: dict[str, tuple[float, float]] = {}
    for step in steps:
        ms = sorted(1e3 * p.get(step, 0.0) for p in passes)
        p95 = ms[max(0, -(-95 * len(ms) // 100) - 1)]
        out[step] = (round(statistics.median(ms), 1), round(p95, 1))
    return out
