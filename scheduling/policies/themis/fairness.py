"""Themis' finish-time fairness (Mahajan et al., "Themis: Fair and Efficient
GPU Cluster Scheduling", NSDI'20, §3.2): a job's rho is the time it will
have taken to finish in the shared cluster over the time it would take
alone on a 1/N share of it, N the jobs contending,

    rho = T_sh / T_id.

rho < 1 is better than fair, rho > 1 worse. Both times are estimates the
job's own agent makes from what Themis knows of it: its work (samples)
and its speed on each GPU type from its profiles, at the type level
(:func:`~scheduling.policies.rigid.type_curves`).

- T_id = work / X_id, X_id the job's speed on its GPU count at the cluster's
  type mix (each type's speed weighted by its share of the GPUs), slowed
  by the share 1/N of the cluster when that share is below its request:
  a rigid job on fewer GPUs than it asks for time-shares them.
- T_sh = elapsed + remaining / X, X the speed of its configuration
  now; a job without GPUs is estimated at X_id's request speed (the speed
  of its GPU count at the type mix), from now.

A bid's value is how much a bundle improves the job's rho over not
winning this lease (§3.3, the valuations of the partial allocation): the
ratio of T_sh without the bundle (one lease lost) to T_sh with it. T_id
is the same on both sides and cancels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from scheduling.policies.gavel.lp import type_throughput
from shared.cluster import Cluster
from shared.estimate import JobEstimate

K = TypeVar("K", bound=str)


@dataclass(frozen=True, slots=True)
class Standing:
    """What a job's agent knows when it computes rho."""

    elapsed_s: float  # since the job arrived
    total: float  # samples in all
    remaining: float  # samples left
    request_rate: float  # samples/s on its GPU count at the cluster's type mix
    current_rate: float  # samples/s of its configuration now (0: it has none)


def mix_rate(est: JobEstimate, cluster: Cluster, gpus: int) -> float:
    """Samples/s on ``gpus`` GPUs at the cluster's type mix: each type's
    speed (its type curve) weighted by the type's share of the GPUs, over
    the types the job runs on."""
    terms = [(share, type_throughput(est, cluster, t, gpus))
             for t, share in cluster.type_share().items()]
    runs = [(p, x) for p, x in terms if p > 0 and x > 0]
    mass = sum(p for p, _ in runs)
    return sum(p * x for p, x in runs) / mass if mass > 0 else 0.0


def fair_rate(request_rate: float, gpus: int, total_gpus: int, contenders: int) -> float:
    """X_id: the request's speed on a 1/N share of the cluster, slowed in
    proportion when the share holds fewer GPUs than the request."""
    share = total_gpus / max(1, contenders)
    return request_rate * min(1.0, share / max(1, gpus))


def t_id(s: Standing, x_id: float) -> float:
    """T_id: the whole job alone on its 1/N share."""
    return s.total / x_id if x_id > 0 else math.inf


def t_sh(s: Standing, rate: float, delay_s: float = 0.0) -> float:
    """T_sh: elapsed, plus ``delay_s`` (a lease lost, a restart), plus the
    remaining work at ``rate``."""
    if s.remaining <= 0:
        return s.elapsed_s + delay_s
    return s.elapsed_s + delay_s + (s.remaining / rate if rate > 0 else math.inf)


def rho(s: Standing, x_id: float) -> float:
    """rho = T_sh / T_id at the job's speed now (its request's speed when it
    has no GPUs)."""
    rate = s.current_rate if s.current_rate > 0 else s.request_rate
    ideal = t_id(s, x_id)
    return t_sh(s, rate) / ideal if 0 < ideal < math.inf else 0.0


def value(s: Standing, rate: float, restart_s: float, lease_s: float) -> float:
    """A bundle's value to the job: rho without it over rho with it. Without
    it the job loses a lease, then goes on at its speed now (its request's
    when it has none); with it the job runs at ``rate`` after ``restart_s``
    (0 for its own configuration kept)."""
    base = s.current_rate if s.current_rate > 0 else s.request_rate
    with_it = t_sh(s, rate, restart_s)
    if not math.isfinite(with_it) or with_it <= 0:
        return 0.0
    return t_sh(s, base, lease_s) / with_it


def ranked(rhos: Mapping[K, float], submitted: Mapping[K, float]) -> list[K]:
    """Furthest from fair first: rho descending, then arrival, then id."""
    return sorted(rhos, key=lambda j: (-rhos[j], submitted[j], j))
