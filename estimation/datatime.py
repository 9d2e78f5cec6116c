"""The bimodal data-time model of Hops §3.5, Eq. (3).

Data time either hits the in-memory cache, T_cache ~ N(mu_c, sd_c) with
probability p_cache, or loads from disk, T_load ~ N(mu_l, sd_l). The two
components are fitted by expectation-maximisation of a 1-D Gaussian mixture,
with a one-component fallback when the data gives no evidence of two modes
(stable data loading, which the paper observes for many jobs). The
synchronisation wait T_w follows the same condition (§3.5), so its mean is
estimated per component, and kept apart per number of ranks: a wait is
how long the fastest rank idles for the slowest, so it grows with the ranks
and a single process has none of it. Pooling the waits of a four-GPU run
into the one-GPU estimate would charge a one-GPU placement for peers it
does not have.
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
Ranks = npt.NDArray[np.int64]

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
    ``wait_means`` is (E[T_w | cache], E[T_w | load]) over all samples;
    ``rank_waits`` holds the same pair per number of ranks the samples were
    measured with, ``(ranks, cache, load)`` by ascending ranks (see
    :meth:`waits`)."""

    p_cache: float = 1.0
    mu_cache: float = 0.0
    sd_cache: float = 0.0
    mu_load: float = 0.0
    sd_load: float = 0.0
    wait_means: tuple[float, float] = (0.0, 0.0)
    samples: int = 0
    rank_waits: tuple[tuple[int, float, float], ...] = ()

    @property
    def components(self) -> int:
        return 1 if self.p_cache >= 1.0 else 2

    @property
    def mean(self) -> float:
        """E[T_d] under the mixture."""
        return self.p_cache * self.mu_cache + (1.0 - self.p_cache) * self.mu_load

    def waits(self, ranks: int) -> tuple[float, float]:
        """(E[T_w | cache], E[T_w | load]) of a placement with ``ranks``
        ranks: as measured with that many, else with the most ranks measured
        below it (waits grow with the ranks, so this errs low, as a profiled
        T_w does in the paper), else the fewest measured above it; the pooled
        ``wait_means`` when nothing was measured per rank."""
        below = [w for w in self.rank_waits if w[0] <= ranks]
        if below:
            return below[-1][1], below[-1][2]
        if self.rank_waits:
            return self.rank_waits[0][1], self.rank_waits[0][2]
        return self.wait_means


class _Mixture(NamedTuple):
    weights: Array
    mu: Array
    sd: Array
    loglik: float
    resp: Array


# EM keeps one row per component, shape (2, n): with (n, 2) every numpy loop
# runs over two elements at a time and is several times slower. The data are
# centred on their mean, so that the M-step's variance, E[x²] - E[x]², does
# not cancel away the precision of components far from zero; the M-step's
# three sums per component are one matrix product, and the parameters in
# between are plain floats (numpy's per-call cost on two elements is most of
# an iteration when the history is short).


def _e_step(xc: Array, w: Sequence[float], mu: Sequence[float],
            sd: Sequence[float]) -> tuple[Array, float]:
    """Responsibilities, shape (2, n), and the log-likelihood of the centred
    data ``xc`` under the mixture ``(w, mu, sd)``."""
    p = np.array([
        [mu[0], -0.5 / (sd[0] * sd[0]), math.log(w[0]) - math.log(sd[0]) - _LOG_SQRT_2PI],
        [mu[1], -0.5 / (sd[1] * sd[1]), math.log(w[1]) - math.log(sd[1]) - _LOG_SQRT_2PI],
    ])
    # log(w_k · N(x; mu_k, sd_k)) = a_k - (x - mu_k)² / (2 sd_k²)
    logp: Array = xc - p[:, 0:1]
    logp *= logp
    logp *= p[:, 1:2]
    logp += p[:, 2:3]
    lse = np.logaddexp(logp[0], logp[1])
    logp -= lse
    np.exp(logp, out=logp)
    return logp, float(np.add.reduce(lse))


def _em(x: Array, mu: Array, sd: Array, weights: Array, floor: float,
        settings: DataTimeSettings) -> _Mixture | None:
    """Plain EM from one starting point; None if a component empties."""
    n = x.size
    shift = float(x.mean())
    xc = x - shift
    moments = np.stack((np.ones(n), xc, xc * xc), axis=1)
    m = [float(mu[0]) - shift, float(mu[1]) - shift]
    s, w = [float(v) for v in sd], [float(v) for v in weights]
    prev = -math.inf
    resp, loglik = _e_step(xc, w, m, s)
    for _ in range(settings.max_iter):
        (n0, x0, xx0), (n1, x1, xx1) = (resp @ moments).tolist()
        if min(n0, n1) < 1e-9:
            return None
        w = [n0 / n, n1 / n]
        m = [x0 / n0, x1 / n1]
        s = [max(math.sqrt(max(xx0 / n0 - m[0] * m[0], 0.0)), floor),
             max(math.sqrt(max(xx1 / n1 - m[1] * m[1], 0.0)), floor)]
        resp, loglik = _e_step(xc, w, m, s)
        if loglik - prev <= settings.tol * max(1.0, abs(loglik)):
            break
        prev = loglik
    return _Mixture(np.array(w), np.array(m) + shift, np.array(s), loglik, resp.T)


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


def _one_component(x: Array, w: Array, ranks: Ranks) -> DataTimeModel:
    mu, sd = float(x.mean()), float(x.std())
    wait = float(w.mean())
    per_rank = _rank_waits(w, ranks, np.zeros(x.size, dtype=bool))
    return DataTimeModel(1.0, mu, sd, mu, sd, (wait, wait), int(x.size), per_rank)


def _rank_waits(
    w: Array, ranks: Ranks, load: npt.NDArray[np.bool_]
) -> tuple[tuple[int, float, float], ...]:
    """(ranks, E[T_w | cache], E[T_w | load]) per number of ranks; ``load``
    marks the iterations credited to the load condition. A condition without
    iterations at some rank count takes that count's overall mean."""
    out = []
    for r in np.unique(ranks).tolist():
        at = ranks == r
        overall = float(w[at].mean())
        cache_w, load_w = w[at & ~load], w[at & load]
        out.append((
            int(r),
            float(cache_w.mean()) if cache_w.size else overall,
            float(load_w.mean()) if load_w.size else overall,
        ))
    return tuple(out)


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
    ranks: Sequence[int] | Ranks | None = None,
) -> DataTimeModel:
    """Fit Eq. (3) to observed data times, and the per-condition wait means.

    ``t_w`` is paired with ``t_d`` per iteration (None or empty: zeros), and
    so is ``ranks``, the number of ranks each iteration ran with (None: one).
    Each iteration's wait is credited to its most probable data-time
    condition; the wait means are given overall and per number of ranks.
    """
    cfg = settings or DataTimeSettings()
    x = np.asarray(t_d, dtype=np.float64)
    w = np.zeros_like(x) if t_w is None or len(t_w) == 0 else np.asarray(t_w, dtype=np.float64)
    r = np.ones(x.size, dtype=np.int64) if ranks is None else np.asarray(ranks, dtype=np.int64)
    if w.shape != x.shape or r.shape != x.shape:
        raise ValueError(f"{w.size} waits and {r.size} rank counts for {x.size} data times")
    if x.size == 0:
        return DataTimeModel()
    spread = float(x.std())
    # Spread at rounding-error level is stable loading, not two modes.
    if x.size < cfg.min_samples or spread <= 1e-9 * abs(float(x.mean())):
        return _one_component(x, w, r)
    floor = cfg.sd_floor * spread
    mix = _best_mixture(x, floor, cfg)
    if mix is None or not _accept(mix, x, floor, cfg):
        return _one_component(x, w, r)
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
        rank_waits=_rank_waits(w, r, label == hi),
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
    Samples with a number of ranks the fit has not seen also call for a refit:
    a job that moves to a new placement size gets its waits at once.
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
        self._ranks: deque[int] = deque(maxlen=window)
        self._model: DataTimeModel | None = None
        self._new = 0  # samples added since the last fit
        self._unseen = False  # a rank count the last fit has no waits for

    def __len__(self) -> int:
        return len(self._data)

    def add(
        self, t_d: Iterable[float], t_w: Iterable[float] = (), ranks: int | Iterable[int] = 1
    ) -> None:
        """Append paired samples; an empty ``t_w`` means zero waits.
        ``ranks``: the number of ranks they ran with, one for all or one each."""
        data = tuple(t_d)
        waits = tuple(t_w) or (0.0,) * len(data)
        counts = (ranks,) * len(data) if isinstance(ranks, int) else tuple(ranks)
        if len(waits) != len(data) or len(counts) != len(data):
            raise ValueError(
                f"{len(waits)} wait samples and {len(counts)} rank counts for "
                f"{len(data)} data samples"
            )
        if any(r < 1 for r in counts):
            raise ValueError("rank counts must be >= 1")
        if not data:
            return
        self._data.extend(data)
        self._wait.extend(waits)
        self._ranks.extend(counts)
        self._new += len(data)
        if self._model is not None:
            fitted = {w[0] for w in self._model.rank_waits}
            self._unseen = self._unseen or any(r not in fitted for r in set(counts))

    @property
    def data_times(self) -> tuple[float, ...]:
        return tuple(self._data)

    @property
    def wait_times(self) -> tuple[float, ...]:
        return tuple(self._wait)

    @property
    def rank_counts(self) -> tuple[int, ...]:
        return tuple(self._ranks)

    def model(self) -> DataTimeModel:
        """The current fit of Eq. (3), refitted lazily (see the class doc)."""
        model = self._model
        grown = self._new >= max(1.0, self.refit_growth * model.samples) if model else True
        if model is not None and not grown and not self._unseen:
            return model
        self._new, self._unseen = 0, False
        self._model = fit_data_time(
            np.fromiter(self._data, dtype=np.float64, count=len(self._data)),
            np.fromiter(self._wait, dtype=np.float64, count=len(self._wait)),
            self.settings,
            np.fromiter(self._ranks, dtype=np.int64, count=len(self._ranks)),
        )
        return self._model
