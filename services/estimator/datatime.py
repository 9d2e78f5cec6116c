"""The bimodal data-time model of Hops §3.5, Eq. (3).

Data time either hits the in-memory cache, T_cache ~ N(mu_c, sd_c) with
probability p_cache, or loads from disk, T_load ~ N(mu_l, sd_l). The two
components are fitted by expectation-maximisation of a 1-D Gaussian mixture,
with a one-component fallback when the data gives no evidence of two modes
(stable data loading, which the paper observes for many jobs). The
synchronisation wait T_w follows the same condition (§3.5), so its mean is
estimated per component.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class DataTimeSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Knobs of the fit.

    ``min_weight`` and ``min_separation`` (Ashman's D =
    sqrt(2)·|mu_c - mu_l| / sqrt(sd_c² + sd_l²)) guard against EM splitting
    one skewed mode in two; ``sd_floor`` (relative to the sample standard
    deviation) keeps a tight component from collapsing to zero variance.
    """

    min_samples: int = 8
    min_weight: float = 0.05
    min_separation: float = 2.0
    max_iter: int = 100
    tol: float = 1e-6
    sd_floor: float = 1e-3


class DataTimeModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Eq. (3) fitted: the cache component is the faster one. A one-component
    model has ``p_cache == 1`` and the load component equal to it.
    ``wait_means`` is (E[T_w | cache], E[T_w | load])."""

    p_cache: float = 1.0
    mu_cache: float = 0.0
    sd_cache: float = 0.0
    mu_load: float = 0.0
    sd_load: float = 0.0
    wait_means: tuple[float, float] = (0.0, 0.0)
    samples: int = 0

    @property
    def components(self) -> int:
        return 1 if self.p_cache >= 1.0 else 2

    @property
    def mean(self) -> float:
        """E[T_d] under the mixture."""
        return self.p_cache * self.mu_cache + (1.0 - self.p_cache) * self.mu_load


class _Mixture(NamedTuple):
    weights: Array
    mu: Array
    sd: Array
    loglik: float
    resp: Array


# EM keeps one row per component, shape (2, n): with (n, 2) every numpy loop
# runs over two elements at a time and is several times slower. The
# arithmetic is element for element the same, and a row's cumulative sum adds
# in the order ``(n, 2).sum(axis=0)`` does, so the fit is unchanged.


def _log_joint(x: Array, weights: Array, mu: Array, sd: Array) -> Array:
    """log(w_k · N(x_i; mu_k, sd_k)), shape (2, n); ``x`` has shape (1, n)."""
    z = (x - mu[:, None]) / sd[:, None]
    out: Array = np.log(weights)[:, None] - 0.5 * z * z - np.log(sd)[:, None] - _LOG_SQRT_2PI
    return out


def _e_step(x: Array, weights: Array, mu: Array, sd: Array) -> tuple[Array, float]:
    logp = _log_joint(x, weights, mu, sd)
    lse = np.logaddexp(logp[0], logp[1])
    resp: Array = np.exp(logp - lse)
    # The ufuncs' own reductions: ndarray.sum and np.cumsum reach them through
    # Python wrappers, a cost that EM's many short iterations feel.
    return resp, float(np.add.reduce(lse))


def _row_sums(a: Array) -> Array:
    """Each row's sum, added in index order (see above)."""
    out: Array = np.add.accumulate(a, axis=1)[:, -1]
    return out


def _em(x: Array, mu: Array, sd: Array, weights: Array, floor: float,
        settings: DataTimeSettings) -> _Mixture | None:
    """Plain EM from one starting point; None if a component empties."""
    prev = -math.inf
    row = x[None, :]
    resp, loglik = _e_step(row, weights, mu, sd)
    for _ in range(settings.max_iter):
        nk = _row_sums(resp)
        if float(np.minimum.reduce(nk)) < 1e-9:
            return None
        weights = nk / x.size
        mu = _row_sums(resp * row) / nk
        var = _row_sums(resp * (row - mu[:, None]) ** 2) / nk
        sd = np.maximum(np.sqrt(var), floor)
        resp, loglik = _e_step(row, weights, mu, sd)
        if loglik - prev <= settings.tol * max(1.0, abs(loglik)):
            break
        prev = loglik
    return _Mixture(weights, mu, sd, loglik, resp.T)


def _starts(x: Array, floor: float) -> list[tuple[Array, Array, Array]]:
    """Deterministic starting points: a split at the widest gap of the sorted
    data (finds well-separated modes at any mixing ratio) and a quantile split
    (for overlapping modes)."""
    xs = np.sort(x)
    cut = int(np.argmax(np.diff(xs))) + 1
    left, right = xs[:cut], xs[cut:]
    gap = (
        np.array([left.mean(), right.mean()]),
        np.maximum(np.array([left.std(), right.std()]), floor),
        np.array([left.size, right.size], dtype=np.float64) / xs.size,
    )
    spread = max(float(xs.std()) / 2.0, floor)
    quant = (
        np.quantile(xs, [0.25, 0.75]).astype(np.float64),
        np.array([spread, spread]),
        np.array([0.5, 0.5]),
    )
    return [gap, quant]


def _best_mixture(x: Array, floor: float, settings: DataTimeSettings) -> _Mixture | None:
    best: _Mixture | None = None
    for mu, sd, weights in _starts(x, floor):
        fit = _em(x, mu, sd, weights, floor, settings)
        if fit is not None and (best is None or fit.loglik > best.loglik):
            best = fit
    return best


def _one_component(x: Array, w: Array) -> DataTimeModel:
    mu, sd = float(x.mean()), float(x.std())
    wait = float(w.mean())
    return DataTimeModel(1.0, mu, sd, mu, sd, (wait, wait), int(x.size))


def _accept(mix: _Mixture, x: Array, floor: float, settings: DataTimeSettings) -> bool:
    """Model selection: two components only if BIC prefers them and they are
    substantial and separated."""
    n = x.size
    # Maximum log-likelihood of one Gaussian: -n/2 - n·log(sd) - n·log√(2π).
    sd1 = max(float(x.std()), floor)
    loglik1 = -n * (0.5 + math.log(sd1) + _LOG_SQRT_2PI)
    bic1 = -2.0 * loglik1 + 2 * math.log(n)
    bic2 = -2.0 * mix.loglik + 5 * math.log(n)
    separation = math.sqrt(2.0) * abs(float(mix.mu[1] - mix.mu[0])) / float(
        np.sqrt((mix.sd**2).sum())
    )
    return (
        bic2 < bic1
        and float(mix.weights.min()) >= settings.min_weight
        and separation >= settings.min_separation
    )


def fit_data_time(
    t_d: Sequence[float] | Array,
    t_w: Sequence[float] | Array | None = None,
    settings: DataTimeSettings | None = None,
) -> DataTimeModel:
    """Fit Eq. (3) to observed data times, and the per-condition wait means.

    ``t_w`` is paired with ``t_d`` per iteration (None or empty: zeros). Each
    iteration's wait is credited to its most probable data-time condition.
    """
    cfg = settings or DataTimeSettings()
    x = np.asarray(t_d, dtype=np.float64)
    w = np.zeros_like(x) if t_w is None or len(t_w) == 0 else np.asarray(t_w, dtype=np.float64)
    if w.shape != x.shape:
        raise ValueError(f"t_w has {w.size} samples for {x.size} data times")
    if x.size == 0:
        return DataTimeModel()
    spread = float(x.std())
    # Spread at rounding-error level is stable loading, not two modes.
    if x.size < cfg.min_samples or spread <= 1e-9 * abs(float(x.mean())):
        return _one_component(x, w)
    floor = cfg.sd_floor * spread
    mix = _best_mixture(x, floor, cfg)
    if mix is None or not _accept(mix, x, floor, cfg):
        return _one_component(x, w)
    lo, hi = (0, 1) if mix.mu[0] <= mix.mu[1] else (1, 0)
    label = np.argmax(mix.resp, axis=1)
    waits = tuple(float(w[label == k].mean()) if np.any(label == k) else float(w.mean())
                  for k in (lo, hi))
    return DataTimeModel(
        p_cache=float(mix.weights[lo]),
        mu_cache=float(mix.mu[lo]),
        sd_cache=float(mix.sd[lo]),
        mu_load=float(mix.mu[hi]),
        sd_load=float(mix.sd[hi]),
        wait_means=(waits[0], waits[1]),
        samples=int(x.size),
    )


class DataTimeSamples:
    """Bounded history of paired (data, wait) samples with a cached fit.

    Keeps the most recent ``window`` iterations: deterministic, bounded
    memory and refit cost, and it lets the model follow drift (a dataset
    that starts fitting in the page cache, say). The fit is recomputed only
    once the samples added since the last fit reach ``refit_growth`` times
    the samples that fit saw (as many again by default: a refit each time
    the history doubles, then once per window): a few dozen
    new iterations barely move a fit over thousands, and EM over the whole
    window is the estimator's most expensive step, so refits stay amortised O(1) per sample.
    """

    def __init__(
        self,
        window: int = 4096,
        settings: DataTimeSettings | None = None,
        refit_growth: float = 1.0,
    ) -> None:
        if window <= 0:
            raise ValueError("window must be > 0")
        if refit_growth < 0:
            raise ValueError("refit_growth must be >= 0")
        self.window = window
        self.settings = settings or DataTimeSettings()
        self.refit_growth = refit_growth
        self._data: deque[float] = deque(maxlen=window)
        self._wait: deque[float] = deque(maxlen=window)
        self._model: DataTimeModel | None = None
        self._new = 0  # samples added since the last fit

    def __len__(self) -> int:
        return len(self._data)

    def add(self, t_d: Iterable[float], t_w: Iterable[float] = ()) -> None:
        """Append paired samples; an empty ``t_w`` means zero waits."""
        data = tuple(t_d)
        waits = tuple(t_w) or (0.0,) * len(data)
        if len(waits) != len(data):
            raise ValueError(f"{len(waits)} wait samples for {len(data)} data samples")
        if not data:
            return
        self._data.extend(data)
        self._wait.extend(waits)
        self._new += len(data)

    @property
    def data_times(self) -> tuple[float, ...]:
        return tuple(self._data)

    @property
    def wait_times(self) -> tuple[float, ...]:
        return tuple(self._wait)

    def model(self) -> DataTimeModel:
        """The current fit of Eq. (3), refitted lazily (see the class doc)."""
        model = self._model
        if model is not None and self._new < max(1.0, self.refit_growth * model.samples):
            return model
        self._new = 0
        self._model = fit_data_time(
            np.fromiter(self._data, dtype=np.float64, count=len(self._data)),
            np.fromiter(self._wait, dtype=np.float64, count=len(self._wait)),
            self.settings,
        )
        return self._model
