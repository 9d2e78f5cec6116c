"""The order-statistics wait of bench/accuracy_waits.py: E[max of N] - E."""

from __future__ import annotations

import pytest

from bench.accuracy_waits import wait_from_data_spread


def test_two_equally_likely_values() -> None:
    # max of two draws of {0, 1} is 1 unless both are 0: E = 3/4, mean 1/2.
    assert wait_from_data_spread([0.0, 1.0], 2) == pytest.approx(0.25)
    # N draws: 1 - (1/2)^N.
    assert wait_from_data_spread([1.0, 0.0], 4) == pytest.approx(1 - 0.5**4 - 0.5)


def test_one_rank_or_no_spread_waits_nothing() -> None:
    assert wait_from_data_spread([0.3, 0.1, 0.2], 1) == pytest.approx(0.0)
    assert wait_from_data_spread([0.01] * 10, 8) == pytest.approx(0.0)


def test_waits_grow_with_the_ranks() -> None:
    t_d = [0.010, 0.011, 0.013, 0.020]
    waits = [wait_from_data_spread(t_d, n) for n in (2, 4, 8)]
    assert waits == sorted(waits) and waits[0] > 0


def test_no_data_or_no_ranks_is_refused() -> None:
    with pytest.raises(ValueError):
        wait_from_data_spread([], 2)
    with pytest.raises(ValueError):
        wait_from_data_spread([0.1], 0)
