"""The bimodal data-time model of Eq. (3)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimation.datatime import DataTimeModel, DataTimeSamples, fit_data_time

P_CACHE, MU_C, SD_C, MU_L, SD_L = 0.65, 0.012, 0.002, 0.180, 0.025
W_C, W_L = 0.040, 0.006


def bimodal(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Data and paired wait times from the known Eq. (3) source."""
    rng = np.random.default_rng(seed)
    hit = rng.random(n) < P_CACHE
    t_d = np.where(hit, rng.normal(MU_C, SD_C, n), rng.normal(MU_L, SD_L, n))
    t_w = np.where(hit, rng.normal(W_C, 0.004, n), rng.normal(W_L, 0.001, n))
    return np.clip(t_d, 0.0, None), np.clip(t_w, 0.0, None)


def test_recovers_known_bimodal_source() -> None:
    t_d, t_w = bimodal(3000, seed=7)
    m = fit_data_time(t_d, t_w)
    assert m.components == 2
    assert m.p_cache == pytest.approx(P_CACHE, abs=0.03)
    assert m.mu_cache == pytest.approx(MU_C, rel=0.03)
    assert m.sd_cache == pytest.approx(SD_C, rel=0.1)
    assert m.mu_load == pytest.approx(MU_L, rel=0.03)
    assert m.sd_load == pytest.approx(SD_L, rel=0.1)
    assert m.wait_means[0] == pytest.approx(W_C, rel=0.05)
    assert m.wait_means[1] == pytest.approx(W_L, rel=0.05)
    assert m.samples == 3000


def test_rare_mode_is_still_found() -> None:
    # 10% disk loads, well separated: the widest-gap start finds them.
    rng = np.random.default_rng(11)
    hit = rng.random(2000) < 0.9
    t_d = np.where(hit, rng.normal(0.01, 0.001, 2000), rng.normal(0.3, 0.02, 2000))
    m = fit_data_time(t_d)
    assert m.p_cache == pytest.approx(0.9, abs=0.02)
    assert m.mu_load == pytest.approx(0.3, rel=0.02)


def test_unimodal_data_gets_one_component() -> None:
    rng = np.random.default_rng(5)
    t_d = rng.normal(0.1, 0.01, 3000)
    m = fit_data_time(t_d)
    assert m.components == 1
    assert m.p_cache == 1.0
    assert m.mu_cache == m.mu_load == pytest.approx(float(t_d.mean()))
    assert m.sd_cache == pytest.approx(float(t_d.std()))


def test_skewed_unimodal_data_is_not_split() -> None:
    # A lognormal is not two modes; separation/BIC must keep one component.
    rng = np.random.default_rng(9)
    assert fit_data_time(rng.lognormal(-3.0, 0.4, 3000)).components == 1


def test_too_few_samples_fall_back_to_one_component() -> None:
    t_d, _ = bimodal(7, seed=1)
    assert fit_data_time(t_d).components == 1


def test_stable_loading_has_zero_spread() -> None:
    m = fit_data_time([0.05] * 20, [0.01] * 20)
    assert m.components == 1
    assert m.mu_cache == m.mu_load == pytest.approx(0.05)
    assert m.sd_cache == m.sd_load == pytest.approx(0.0, abs=1e-12)
    assert m.wait_means == pytest.approx((0.01, 0.01))
    assert m.samples == 20


def test_empty_history_is_the_default_model() -> None:
    assert fit_data_time([]) == DataTimeModel()


def test_mismatched_wait_samples_are_rejected() -> None:
    with pytest.raises(ValueError):
        fit_data_time([0.1, 0.2], [0.0])


def test_window_keeps_most_recent_samples() -> None:
    hist = DataTimeSamples(window=100)
    hist.add([1.0] * 60)
    hist.add([float(i) for i in range(90)], [0.5] * 90)
    assert len(hist) == 100
    assert hist.data_times == (1.0,) * 10 + tuple(float(i) for i in range(90))
    assert hist.wait_times == (0.0,) * 10 + (0.5,) * 90


def test_model_is_cached_until_new_samples_arrive() -> None:
    t_d, t_w = bimodal(500, seed=2)
    hist = DataTimeSamples()
    hist.add(t_d.tolist(), t_w.tolist())
    first = hist.model()
    assert hist.model() is first
    hist.add([])
    assert hist.model() is first
    # One more iteration over 500 does not pay for a refit...
    hist.add([0.5])
    assert hist.model() is first
    # ...nor do 498 more (the history has not doubled yet)...
    hist.add([0.5] * 498)
    assert hist.model() is first
    # ...as many again does, and the refit sees every sample.
    hist.add([0.5])
    refit = hist.model()
    assert refit is not first and refit.samples == 1000
    eager = DataTimeSamples(refit_growth=0.0)
    eager.add(t_d.tolist(), t_w.tolist())
    before = eager.model()
    eager.add([0.5])
    assert eager.model() is not before and eager.model().samples == 501


finite_times = st.floats(min_value=0.0, max_value=5.0, allow_nan=False, allow_subnormal=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite_times, min_size=1, max_size=120))
def test_fit_invariants(xs: list[float]) -> None:
    m = fit_data_time(xs)
    assert 0.0 < m.p_cache <= 1.0
    assert m.mu_cache <= m.mu_load
    assert m.sd_cache >= 0.0 and m.sd_load >= 0.0
    # An EM M-step preserves the sample mean: p·mu_c + (1-p)·mu_l = mean(x).
    assert m.mean == pytest.approx(float(np.mean(xs)), rel=1e-7, abs=1e-9)
    assert fit_data_time(xs) == m  # deterministic


# --- waits per number of ranks -----------------------------------------------


def test_waits_are_kept_per_number_of_ranks() -> None:
    # The same bimodal data on one rank without waits and on four ranks with
    # the source's waits: the four-rank waits must not leak into one rank.
    t_d, t_w = bimodal(3000, seed=5)
    ranks = np.where(np.arange(3000) < 1000, 1, 4)
    t_w = np.where(ranks == 1, 0.0, t_w)
    m = fit_data_time(t_d, t_w, ranks=ranks)
    assert m.components == 2
    assert [r for r, _, _ in m.rank_waits] == [1, 4]
    assert m.waits(1) == (0.0, 0.0)
    cache4, load4 = m.waits(4)
    assert cache4 == pytest.approx(W_C, rel=0.05)
    assert load4 == pytest.approx(W_L, rel=0.05)
    # Unmeasured counts take the most ranks measured below, else the fewest above.
    assert m.waits(2) == m.waits(1) and m.waits(16) == m.waits(4)
    assert fit_data_time(t_d[1000:], t_w[1000:], ranks=ranks[1000:]).waits(1) == (cache4, load4)
    # The pooled means mix both, as every count did before waits were kept apart.
    assert 0.0 < m.wait_means[0] < cache4
    with pytest.raises(ValueError):
        fit_data_time(t_d, t_w, ranks=ranks[:10])


def test_a_one_component_fit_keeps_waits_per_rank() -> None:
    m = fit_data_time([0.05] * 20, [0.0] * 10 + [0.02] * 10, ranks=[1] * 10 + [2] * 10)
    assert m.components == 1
    assert m.rank_waits == ((1, 0.0, 0.0), (2, pytest.approx(0.02), pytest.approx(0.02)))
    assert DataTimeModel().waits(3) == (0.0, 0.0)


def test_a_new_number_of_ranks_calls_for_a_refit() -> None:
    hist = DataTimeSamples()
    hist.add([0.05] * 200, [0.0] * 200, ranks=1)
    first = hist.model()
    # More one-rank samples do not refit before the history doubles...
    hist.add([0.05] * 10, [0.0] * 10, ranks=1)
    assert hist.model() is first
    # ...but the first samples of a new placement size do.
    hist.add([0.05] * 10, [0.01] * 10, ranks=2)
    second = hist.model()
    assert second is not first and second.waits(2) == pytest.approx((0.01, 0.01))
    assert hist.rank_counts == (1,) * 210 + (2,) * 10
    with pytest.raises(ValueError):
        hist.add([0.05], [0.0], ranks=0)
    with pytest.raises(ValueError):
        hist.add([0.05, 0.05], [0.0, 0.0], ranks=[1])
