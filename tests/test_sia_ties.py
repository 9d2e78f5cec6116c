"""The queue order among Sia's equally valued plans
(scheduling/policies/sia_ties): exchanges that keep the plan
feasible, never lower the objective, and leave no tie against the queue."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.policies.sia.start import Columns, good_start
from scheduling.policies.sia.ties import prefer_queue_order
from tests.test_sia_start import build, columns, feasible, instances


def served(cols: Columns, values: np.ndarray) -> dict[int, int]:
    return {int(cols.job[c]): int(c) for c in np.flatnonzero(values > 0.5)}


def test_an_equal_allocation_goes_to_the_job_ahead_in_the_queue() -> None:
    # Jobs 0 and 1 value the 4 GPUs of type 0 equally; the solver gave them to 1.
    cols = columns([(0, 0, 4, 0.6), (1, 0, 4, 0.6)], 2, (4,))
    out = prefer_queue_order(cols, np.array([0.0, 1.0]))
    assert served(cols, out) == {0: 0}


def test_a_job_ahead_that_values_the_allocation_less_does_not_take_it() -> None:
    cols = columns([(0, 0, 4, 0.5), (1, 0, 4, 0.6)], 2, (4,))
    out = prefer_queue_order(cols, np.array([0.0, 1.0]))
    assert served(cols, out) == {1: 1}


def test_the_job_furthest_back_gives_way() -> None:
    # Served: job 1 (type 0, 4 GPUs) and job 2 (type 1, 2 GPUs). Job 0 values
    # both as their holders do and takes the allocation of job 2.
    rows = [(0, 0, 4, 0.6), (0, 1, 2, 0.7), (1, 0, 4, 0.6), (2, 1, 2, 0.7)]
    cols = columns(rows, 3, (4, 2))
    out = prefer_queue_order(cols, np.array([0.0, 0.0, 1.0, 1.0]))
    assert served(cols, out) == {0: 1, 1: 2}


def test_a_displaced_job_takes_its_turn_further_down_the_queue() -> None:
    # Served: job 1 (type 0, 4 GPUs) and job 3 (type 1, 2 GPUs). Job 0 takes
    # job 1's allocation; job 1, now unserved, takes job 3's.
    rows = [(0, 0, 4, 0.6), (1, 0, 4, 0.6), (1, 1, 2, 0.7), (2, 0, 4, 0.1), (3, 1, 2, 0.7)]
    cols = columns(rows, 4, (4, 2))
    out = prefer_queue_order(cols, np.array([0.0, 1.0, 0.0, 0.0, 1.0]))
    assert served(cols, out) == {0: 0, 1: 2}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances, st.data())
def test_exchanges_keep_the_plan_feasible_and_leave_no_tie_against_the_queue(
    instance: tuple[int, list[int], list[list[tuple[int, int, float]]]], data: st.DataObject
) -> None:
    cols = build(instance)
    types = len(cols.capacity)
    homes = data.draw(st.lists(st.integers(-1, types - 1), min_size=cols.jobs, max_size=cols.jobs))
    # Coefficients on a coarse grid, so that ties are common.
    cols = Columns(cols.job, cols.gpu_type, cols.gpus, np.round(cols.coeff, 1) + 0.1,
                   cols.jobs, cols.capacity)
    before = good_start(cols, [homes])
    after = prefer_queue_order(cols, before)
    chosen = np.flatnonzero(after).tolist()
    assert feasible(cols, chosen)
    for t in range(types):
        on = cols.gpu_type == t
        assert (cols.gpus[on] * after[on]).sum() == (cols.gpus[on] * before[on]).sum()
    assert float(cols.coeff @ after) >= float(cols.coeff @ before) - 1e-9
    holders = served(cols, after)
    for job in range(cols.jobs):
        if job in holders:
            continue
        for other, theirs in holders.items():
            mine = [c for c in np.flatnonzero(cols.job == job)
                    if cols.gpu_type[c] == cols.gpu_type[theirs]
                    and cols.gpus[c] == cols.gpus[theirs]]
            if other > job and mine:
                assert cols.coeff[mine[0]] < cols.coeff[theirs] - 1e-9
