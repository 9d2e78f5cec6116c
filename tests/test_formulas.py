"""Eqs. (1), (2), (4), (5) of Hops §3.5 on hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from estimation.formulas import (
    OVERLAP_RESIDUAL,
    comm_time,
    expected_conditional_iter_time,
    expected_iter_time,
    expected_max_normal,
    iter_time,
    throughput,
)
from shared.measurements import Pattern

PATTERNS: tuple[Pattern, ...] = (1, 2)
times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_subnormal=False)


def test_overlap_residual_is_the_papers_constant() -> None:
    assert OVERLAP_RESIDUAL == 0.2


def test_comm_time_single_node_ring_allreduce() -> None:
    # 1e9 params / 1e10 params/s * (4-1)/4 = 0.1 * 0.75 = 0.075 s
    assert comm_time(1e9, 4, 1, link_bw=1e10, net_bw=2e9) == pytest.approx(0.075)


def test_comm_time_multi_node_uses_network_bandwidth() -> None:
    # 1e9 params / 2e9 params/s = 0.5 s, whatever the GPU count
    assert comm_time(1e9, 8, 2, link_bw=1e10, net_bw=2e9) == pytest.approx(0.5)
    assert comm_time(1e9, 16, 4, link_bw=1e10, net_bw=2e9) == pytest.approx(0.5)


def test_comm_time_single_gpu_is_zero() -> None:
    # (N-1)/N = 0 for N = 1
    assert comm_time(1e9, 1, 1, link_bw=1e10, net_bw=2e9) == 0.0


def test_comm_time_rejects_empty_placement() -> None:
    with pytest.raises(ValueError):
        comm_time(1e9, 0, 1, 1e10, 1e9)


# Shared inputs: T_d=0.3, T_f=0.1, T_b=0.2, T_u=0.05, T_w=0.02.
BASE = {"t_d": 0.3, "t_f": 0.1, "t_b": 0.2, "t_u": 0.05, "t_w": 0.02}


def test_pattern1_bp_branch() -> None:
    # T_c=0.1: T̃c=0.02; max(0.2+0.02, 0.1)=0.22; +T_u=0.27;
    # max(T_d=0.3, 0.27)=0.3; +T_f+T_w = 0.3+0.1+0.02 = 0.42
    assert iter_time(**BASE, t_c=0.1, pattern=1) == pytest.approx(0.42)


def test_pattern1_comm_branch() -> None:
    # T_c=0.5: T̃c=0.1; max(0.2+0.1, 0.5)=0.5; +T_u=0.55;
    # max(0.3, 0.55)=0.55; +0.1+0.02 = 0.67
    assert iter_time(**BASE, t_c=0.5, pattern=1) == pytest.approx(0.67)


def test_pattern2_bp_branch() -> None:
    # 0.3 + max(0.22, 0.1) + 0.05 + 0.1 + 0.02 = 0.69
    assert iter_time(**BASE, t_c=0.1, pattern=2) == pytest.approx(0.69)


def test_pattern2_comm_branch_keeps_update_time() -> None:
    # 0.3 + max(0.3, 0.5) + 0.05 + 0.1 + 0.02 = 0.97 (T_u included: erratum)
    assert iter_time(**BASE, t_c=0.5, pattern=2) == pytest.approx(0.97)


def test_single_gpu_iteration_has_no_communication() -> None:
    # N=1 → T_c=0: pattern 2: 0.3 + max(0.2, 0) + 0.05 + 0.1 + 0.02 = 0.67
    t_c = comm_time(1e9, 1, 1, 1e10, 1e9)
    assert iter_time(**BASE, t_c=t_c, pattern=2) == pytest.approx(0.67)
    # pattern 1: max(0.3, 0.2 + 0.05) + 0.1 + 0.02 = 0.42
    assert iter_time(**BASE, t_c=t_c, pattern=1) == pytest.approx(0.42)


def test_expected_iter_time_eq4() -> None:
    # 0.75*0.2 + 0.25*0.6 = 0.15 + 0.15 = 0.3
    assert expected_iter_time(0.75, 0.2, 0.6) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        expected_iter_time(1.5, 0.2, 0.6)


def test_throughput_eq5() -> None:
    # 32 samples / 0.25 s = 128 samples/s per GPU
    assert throughput(32, 0.25) == pytest.approx(128.0)
    with pytest.raises(ValueError):
        throughput(32, 0.0)


def test_expected_max_normal_closed_form() -> None:
    # mu == c: E[max(X, c)] = c + sd·φ(0) = 1 + 0.1/sqrt(2π)
    assert expected_max_normal(1.0, 0.1, 1.0) == pytest.approx(1.0 + 0.1 / math.sqrt(2 * math.pi))
    assert expected_max_normal(0.3, 0.0, 0.5) == 0.5
    rng = np.random.default_rng(3)
    x = rng.normal(0.2, 0.05, 400_000)
    assert expected_max_normal(0.2, 0.05, 0.23) == pytest.approx(
        float(np.maximum(x, 0.23).mean()), rel=2e-3
    )


@given(t_d=times, t_f=times, t_b=times, t_u=times, t_w=times, t_c=times)
def test_pattern2_never_faster_than_pattern1(
    t_d: float, t_f: float, t_b: float, t_u: float, t_w: float, t_c: float
) -> None:
    # Pattern 1 overlaps data loading, which can only hide time.
    p1 = iter_time(t_d, t_f, t_b, t_u, t_w, t_c, 1)
    p2 = iter_time(t_d, t_f, t_b, t_u, t_w, t_c, 2)
    assert p1 <= p2 + 1e-12


@given(mu=times, t_f=times, t_b=times, t_u=times, w=times, t_c=times,
       pattern=st.sampled_from(PATTERNS))
def test_conditional_expectation_without_spread_is_eq1(
    mu: float, t_f: float, t_b: float, t_u: float, w: float, t_c: float, pattern: Pattern
) -> None:
    expected = expected_conditional_iter_time(mu, 0.0, t_f, t_b, t_u, w, t_c, pattern)
    assert expected == pytest.approx(iter_time(mu, t_f, t_b, t_u, w, t_c, pattern))


@given(mu=times, sd=st.floats(0.001, 2.0), c=times)
def test_expected_max_bounds(mu: float, sd: float, c: float) -> None:
    # Jensen: E[max(X, c)] >= max(E[X], c); and max(X, c) <= max(mu, c) + |X - mu|.
    value = expected_max_normal(mu, sd, c)
    assert value >= max(mu, c) - 1e-9
    assert value <= max(mu, c) + sd * math.sqrt(2 / math.pi) + 1e-9
