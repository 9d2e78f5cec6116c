"""The throughput formula of Hops §3.5, one equation per function.

All times are in seconds, bandwidths in parameters per second, throughputs in
samples per second per GPU.
"""

from __future__ import annotations

import math

# T̃c / T_c of Eq. (1): its default lives with the GPU type that may override
# it (shared.cluster.GpuTypeSpec.overlap_residual); re-exported here.
from shared.cluster import OVERLAP_RESIDUAL as OVERLAP_RESIDUAL
from shared.measurements import Pattern


def comm_time(
    params: float,
    n_gpus: int,
    nodes: int,
    link_bw: float,
    net_bw: float,
    *,
    link_latency: float = 0.0,
    net_latency: float = 0.0,
    collectives: int = 1,
) -> float:
    """Eq. (2): all-reduce time of one iteration, plus a latency term.

    On one node ring all-reduce over the intra-node link moves
    ``params * (N-1)/N`` per GPU, so T_c = params/B_link * (N-1)/N (zero for a
    single GPU). Across nodes the network dominates: T_c = params/B_net.

    ``link_latency``/``net_latency`` (seconds) add the fixed cost α of the
    alpha-beta model, T_c = α + params/B …, for any all-reduce (N > 1). This
    departs from the paper, whose Eq. (2) models bandwidth only; with the
    default 0 it is Eq. (2) exactly. α is one constant per case, as fitted
    at the N it was measured with: a ring's latency grows with N, which it
    does not model. The gradients may go in ``collectives`` all-reduces
    (DistributedDataParallel's buckets); each pays α, the bytes are the same.
    """
    if n_gpus <= 0 or nodes <= 0:
        raise ValueError("n_gpus and nodes must be > 0")
    if nodes == 1 and n_gpus == 1:
        return 0.0  # nothing to reduce: no bandwidth and no latency term
    latency = collectives * collective_latency(n_gpus, nodes, link_latency, net_latency)
    if nodes == 1:
        return latency + params / link_bw * (n_gpus - 1) / n_gpus
    return latency + params / net_bw


def collective_latency(n_gpus: int, nodes: int, link_latency: float, net_latency: float) -> float:
    """α of one collective among ``n_gpus`` over ``nodes`` (0 for one GPU)."""
    if n_gpus <= 1 and nodes <= 1:
        return 0.0
    return link_latency if nodes == 1 else net_latency


def _grad_sync_time(t_b: float, t_c: float, *, residual: float = OVERLAP_RESIDUAL) -> float:
    """max(T_b + T̃c, T_c) of Eq. (1), BP overlapped with communication, with
    T̃c = ``residual``·T_c (the paper's 0.2 by default; 1.0 when nothing
    overlaps, which makes it T_b + T_c)."""
    return max(t_b + residual * t_c, t_c)


def iter_time(
    t_d: float,
    t_f: float,
    t_b: float,
    t_u: float,
    t_w: float,
    t_c: float,
    pattern: Pattern,
    *,
    residual: float = OVERLAP_RESIDUAL,
) -> float:
    """Eq. (1): time of one iteration.

    Pattern 1 also overlaps data loading with BP, communication and update:
    max(T_d, max(T_b + T̃c, T_c) + T_u) + T_f + T_w. Pattern 2 overlaps only
    computation and communication: T_d + max(T_b + T̃c, T_c) + T_u + T_f + T_w.
    (The printed pattern-2 formula drops T_u; the update still runs serially
    after the gradients arrive, so it is kept here.) T̃c = ``residual``·T_c:
    the paper fixes the residual at 0.2; the GPU type may set another
    (:class:`shared.cluster.GpuTypeSpec`).
    """
    sync = _grad_sync_time(t_b, t_c, residual=residual)
    if pattern == 1:
        return max(t_d, sync + t_u) + t_f + t_w
    return t_d + sync + t_u + t_f + t_w


def expected_max_normal(mu: float, sd: float, c: float) -> float:
    """E[max(X, c)] for X ~ N(mu, sd), closed form.

    With z = (c - mu)/sd: c·Φ(z) + mu·(1 - Φ(z)) + sd·φ(z). Pattern 1 of
    Eq. (1) needs it because max(T_d, ·) is not linear in T_d, so plugging in
    the mean of T_d would understate E(T_iter).
    """
    if sd <= 0:
        return max(mu, c)
    z = (c - mu) / sd
    cdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return c * cdf + mu * (1.0 - cdf) + sd * pdf


def expected_conditional_iter_time(
    mu_d: float,
    sd_d: float,
    t_f: float,
    t_b: float,
    t_u: float,
    w_mean: float,
    t_c: float,
    pattern: Pattern,
    *,
    residual: float = OVERLAP_RESIDUAL,
) -> float:
    """E(T_iter_c) or E(T_iter_l) of Eq. (4): Eq. (1) in expectation under one
    data-time condition of Eq. (3), T_d ~ N(mu_d, sd_d), with T̃c =
    ``residual``·T_c as in :func:`iter_time`.

    T_w enters Eq. (1) additively, so its conditional mean suffices.
    """
    sync = _grad_sync_time(t_b, t_c, residual=residual)
    if pattern == 1:
        return expected_max_normal(mu_d, sd_d, sync + t_u) + t_f + w_mean
    return mu_d + sync + t_u + t_f + w_mean


def expected_iter_time(p_cache: float, iter_cache: float, iter_load: float) -> float:
    """Eq. (4): E(T_iter) = p_cache·E(T_iter_c) + p_load·E(T_iter_l)."""
    if not 0.0 <= p_cache <= 1.0:
        raise ValueError(f"p_cache must lie in [0, 1], got {p_cache}")
    return p_cache * iter_cache + (1.0 - p_cache) * iter_load


def throughput(batch_size: float, expected_iter: float) -> float:
    """Eq. (5): throughput = batch_size / E(T_iter).

    With the per-GPU batch fixed (§2.2) this is the per-GPU throughput.
    """
    if expected_iter <= 0:
        raise ValueError(f"expected iteration time must be > 0, got {expected_iter}")
    return batch_size / expected_iter
