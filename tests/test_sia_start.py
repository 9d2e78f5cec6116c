"""The starting solution for Sia's ILP (scheduling/policies/sia_start):
feasible always, exact once the homes are right, and the type swaps that
single moves cannot make."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.policies.sia.policy import SiaPolicy, SiaSettings
from scheduling.policies.sia.start import Columns, good_start, search
from shared.snapshot import Snapshot
from tests.helpers import assert_feasible
from tests.test_sia import snapshots


def columns(
    rows: list[tuple[int, int, int, float]], jobs: int, capacity: tuple[int, ...]
) -> Columns:
    """From (job, type, GPUs, coefficient) rows."""
    return Columns(
        job=np.array([r[0] for r in rows], dtype=np.int64),
        gpu_type=np.array([r[1] for r in rows], dtype=np.int64),
        gpus=np.array([r[2] for r in rows], dtype=np.int64),
        coeff=np.array([r[3] for r in rows], dtype=np.float64),
        jobs=jobs,
        capacity=capacity,
    )


def feasible(cols: Columns, chosen: list[int]) -> bool:
    jobs = [int(cols.job[c]) for c in chosen]
    used = [sum(int(cols.gpus[c]) for c in chosen if cols.gpu_type[c] == t)
            for t in range(len(cols.capacity))]
    fits = all(u <= cap for u, cap in zip(used, cols.capacity, strict=True))
    return len(jobs) == len(set(jobs)) and fits


def optimum(cols: Columns) -> tuple[float, list[int]]:
    """Brute force over every job's column or none."""
    per_job = [[None, *np.flatnonzero(cols.job == j).tolist()] for j in range(cols.jobs)]
    best: tuple[float, list[int]] = (0.0, [])
    for pick in itertools.product(*per_job):
        chosen = [c for c in pick if c is not None]
        value = float(cols.coeff[chosen].sum()) if chosen else 0.0
        if feasible(cols, chosen) and value > best[0] + 1e-12:
            best = (value, chosen)
    return best


instances = st.integers(1, 3).flatmap(
    lambda types: st.tuples(
        st.just(types),
        st.lists(st.integers(0, 8), min_size=types, max_size=types),
        st.lists(
            st.lists(st.tuples(st.integers(0, types - 1), st.integers(1, 5),
                               st.integers(1, 100).map(lambda v: v / 100)),
                     min_size=1, max_size=3, unique_by=lambda o: (o[0], o[1])),
            min_size=1, max_size=5,
        ),
    )
)


def build(instance: tuple[int, list[int], list[list[tuple[int, int, float]]]]) -> Columns:
    _types, caps, jobs = instance
    rows = [(j, t, g, v) for j, opts in enumerate(jobs) for t, g, v in opts]
    return columns(rows, len(jobs), tuple(caps))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances, st.data())
def test_any_homes_give_a_feasible_start_and_the_optimums_homes_give_the_optimum(
    instance: tuple[int, list[int], list[list[tuple[int, int, float]]]], data: st.DataObject
) -> None:
    cols = build(instance)
    types = len(cols.capacity)
    homes = data.draw(st.lists(st.integers(-1, types - 1), min_size=cols.jobs, max_size=cols.jobs))
    start = good_start(cols, [homes])
    chosen = np.flatnonzero(start).tolist()
    assert set(np.unique(start)) <= {0.0, 1.0}
    assert feasible(cols, chosen)
    best, best_cols = optimum(cols)
    assert float(cols.coeff[chosen].sum()) <= best + 1e-9
    # Given the optimum's types, the per-type knapsacks are exact.
    right = [-1] * cols.jobs
    for c in best_cols:
        right[int(cols.job[c])] = int(cols.gpu_type[c])
    found = search(cols, right)
    assert float(cols.coeff[found].sum()) == pytest.approx(best)


def test_a_single_move_gains_a_job_that_the_home_type_had_no_room_for() -> None:
    # Type 0 has 4 GPUs for jobs 0 and 1 (4 each); job 1 also runs on type 1.
    cols = columns([(0, 0, 4, 0.6), (1, 0, 4, 0.5), (1, 1, 4, 0.4)], 2, (4, 4))
    chosen = search(cols, [0, 0])
    assert sorted(chosen) == [0, 2]


def test_two_jobs_in_each_others_best_type_swap() -> None:
    # Each type holds one 4-GPU job; each job is worth 1.0 on the other type
    # and 0.5 where it is. Moving either alone gains nothing (the other type
    # is full and the move would evict a job worth as much); the swap gains 1.
    cols = columns([(0, 0, 4, 0.5), (0, 1, 4, 1.0), (1, 1, 4, 0.5), (1, 0, 4, 1.0)], 2, (4, 4))
    chosen = search(cols, [0, 1])
    assert sorted(chosen) == [1, 3]
    assert float(cols.coeff[chosen].sum()) == pytest.approx(2.0)


def test_settings_reject_an_unknown_start() -> None:
    with pytest.raises(ValueError, match="start"):
        SiaSettings(start="best")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_the_search_start_plans_within_the_gap_of_the_rounded_lp_start(s: Snapshot) -> None:
    default = SiaPolicy(SiaSettings(start="rounded-lp")).plan(s)
    searched = SiaPolicy(SiaSettings(start="search")).plan(s)
    assert_feasible(searched, s)
    if not s.first_plan:
        return
    a, b = default.reasons.passes[0].objective, searched.reasons.passes[0].objective
    assert abs(a - b) <= 2e-4 * max(abs(a), abs(b), 1.0)
