"""EASY backfill's rule (scheduling/backfill.py): the shadow time by hand,
and over random scenes the rule's promise: whatever it lets start never
delays the reserved head's start, and the same scene gives the same answer."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.backfill import Release, Shadow, ends_by, shadow, spare

Parts = tuple[tuple[str, int], ...]


def spread(need: int) -> Callable[[Mapping[str, int]], Parts | None]:
    """A fit that takes ``need`` units wherever they are, keys in order
    (it fits exactly when ``need`` units are free in all)."""
    def fit(free: Mapping[str, int]) -> Parts | None:
        out: list[tuple[str, int]] = []
        left = need
        for key in sorted(free):
            n = min(max(free[key], 0), left)
            if n:
                out.append((key, n))
                left -= n
        return tuple(out) if left == 0 else None
    return fit


def test_the_shadow_time_is_the_end_that_frees_enough_and_never_before_now() -> None:
    fit = spread(4)
    releases: list[Release[str]] = [(30.0, [("b", 2)]), (10.0, [("a", 1)]), (20.0, [("a", 1)])]
    found = shadow({"a": 1}, releases, 0.0, fit)
    assert found == Shadow(30.0, {"a": 3, "b": 2}, (("a", 3), ("b", 1)))
    assert shadow({"a": 4}, releases, 5.0, fit) == Shadow(5.0, {"a": 4}, (("a", 4),))
    late = shadow({"a": 1}, [(-3.0, [("a", 3)])], 5.0, fit)
    assert late is not None and late.start == 5.0
    assert shadow({"a": 1}, releases, 0.0, spread(9)) is None


def test_a_job_may_outlive_the_shadow_only_on_units_left_over_then() -> None:
    assert ends_by(10.0, 20.0, 30.0) and not ends_by(10.0, 20.5, 30.0)
    # 3 free now on a, 1 on b; at the shadow time a has 5, b 1, and the head takes 4 of a
    assert spare({"a": 3, "b": 1}, {"a": 5, "b": 1}, [("a", 4)]) == {"a": 1, "b": 1}


Scene = tuple[dict[str, int], list[tuple[float, Parts]], int, list[tuple[int, float]]]


@st.composite
def scenes(draw: st.DrawFn) -> Scene:
    keys = [f"k{i}" for i in range(draw(st.integers(1, 3)))]
    size = draw(st.integers(1, 6))
    free = {k: size for k in keys}
    releases: list[tuple[float, Parts]] = []
    for _ in range(draw(st.integers(0, 6))):
        k = draw(st.sampled_from(keys))
        n = draw(st.integers(1, size))
        if free[k] >= n:
            free[k] -= n
            releases.append((float(draw(st.integers(0, 50))), ((k, n),)))
    need = draw(st.integers(1, len(keys) * size))
    jobs = [(draw(st.integers(1, size)), float(draw(st.integers(1, 80))))
            for _ in range(draw(st.integers(0, 6)))]
    return free, releases, need, jobs


def backfill(scene: Scene) -> tuple[Shadow[str, Parts] | None, list[tuple[float, Parts]],
                                    dict[str, int]]:
    """The head's shadow, then the jobs the rule lets start now, in order,
    each on the first key with room: the releases they add and what stays free."""
    free, releases, need, jobs = scene
    now = 0.0
    found = shadow(free, releases, now, spread(need))
    avail = dict(free)
    started: list[tuple[float, Parts]] = []
    if found is None or found.start <= now:
        return found, started, avail
    future = dict(found.free)
    for gpus, run_s in jobs:
        short = ends_by(now, run_s, found.start)
        room = avail if short else spare(avail, future, found.fit)
        key = next((k for k in sorted(room) if room[k] >= gpus), None)
        if key is None:
            continue
        avail[key] -= gpus
        if not short:
            future[key] -= gpus  # it still holds them at the shadow time
        started.append((now + run_s, ((key, gpus),)))
    return found, started, avail


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_a_backfilled_job_never_delays_the_heads_start(scene: Scene) -> None:
    found, started, avail = backfill(scene)
    assert backfill(scene) == (found, started, avail)  # deterministic
    if found is None or not started:
        return
    _, releases, need, _ = scene
    after = shadow(avail, [*releases, *started], 0.0, spread(need))
    assert after is not None and after.start <= found.start
    assert math.isfinite(after.start)
