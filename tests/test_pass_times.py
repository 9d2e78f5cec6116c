"""Where the leader's task pass spends its time (services.scheduler.passtimes)."""

from __future__ import annotations

import pytest

from services.scheduler.passtimes import TOTAL, PassTimes, summary


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_laps_add_up_per_step_and_only_replanning_passes_are_summarised() -> None:
    clock = Clock()
    times = PassTimes(every=2, clock=clock)
    for ms in (10.0, 30.0):
        times.begin()
        clock.t += 0.001
        times.lap("count")
        clock.t += ms / 1e3
        times.lap("plan")
        clock.t += 0.002
        times.lap("count")  # a step timed twice adds up
        assert times.laps["count"] == pytest.approx(0.003)
        if ms == 10.0:
            assert times.end(replanned=True) is None  # one kept: not yet
            times.begin()
            clock.t += 1.0
            times.lap("send")
            assert times.end(replanned=False) is None  # a resend: dropped
    out = times.end(replanned=True)
    assert out == {"count": (3.0, 3.0), "plan": (20.0, 30.0), TOTAL: (23.0, 33.0)}
    assert times.kept == []


def test_summary_counts_a_step_a_pass_did_not_take_as_zero() -> None:
    passes = [{"save": 0.004, TOTAL: 0.01}] + [{TOTAL: 0.002}] * 19
    out = summary(passes)
    assert list(out) == ["save", TOTAL]  # the whole last
    assert out["save"] == (0.0, 0.0)  # p95 of 20 is the 19th: a zero
    assert summary(passes[:1] * 20)["save"] == (4.0, 4.0)
    with pytest.raises(ValueError):
        PassTimes(every=0)
