"""The forward model of a forecast: the jobs of one snapshot after its plan,
run forward event by event on the cluster's GPUs (docs/explain.md,
"Forecasts").

Running jobs finish at their remaining samples over their throughput;
at each plan the model makes (a later plan :attr:`Model.fill_s` after a
completion, as the mechanism plans after a release, §3.6), the waiting
jobs, in the policy's order, take the best-throughput configuration of
their requirement set that fits what is free. A job's start is the plan
that gives it GPUs; its progress begins after its restart cost.

Nothing here reads a clock or draws a number: the throughput multipliers
of a draw come in as an argument (:func:`run`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.cluster import Cluster
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId

INF = math.inf


@dataclass(frozen=True)
class Placed:
    """A job that holds GPUs at the forecast's start: it runs on ``parts``
    (server index, GPUs) until ``remaining`` samples are done at
    ``throughput`` (scaled by its draw when ``estimated``), from ``begin``."""

    job: int
    parts: tuple[tuple[int, int], ...]
    begin: float
    remaining: float
    throughput: float
    estimated: bool
    # How it waits again if a round's replan preempts it (None: never).
    again: Waiting | None = None


@dataclass(frozen=True)
class Waiting:
    """A job that waits for GPUs: its requirement set (largest first), the
    estimate it is placed with, the GPU types and servers it may use, and
    from when (a profiling job: once it would have been profiled)."""

    job: int
    reqs: tuple[int, ...]
    estimate: JobEstimate | None
    types: tuple[GpuType, ...]
    remaining: float
    restart_s: float
    eligible_at: float
    servers: frozenset[ServerId] | None = None  # None: any server


@dataclass(frozen=True)
class Model:
    """Everything a draw needs, shared by all draws of one forecast."""

    cluster: Cluster
    now: float
    round_s: float
    fill_s: float
    next_round: float
    free: tuple[int, ...]  # per server index, after the plan
    placed: tuple[Placed, ...]
    waiting: tuple[Waiting, ...]  # the policy's order at ``now``
    # Age (Eq. 9) and wait of each job whose priority is its latency ratio
    # (Eq. 8), which grows while it waits; empty when the policy ranks
    # otherwise, and then ``priority`` (the plan's) holds.
    aging: Mapping[int, tuple[float, float]]
    priority: Mapping[int, float]
    rank: Mapping[int, int]  # ties: the order at ``now``
    replan_rounds: int = 96
    # Whether a round's replan preempts running jobs that fall out of the
    # window (off by default: it forecast starts too early, docs/explain.md).
    preempt: bool = False
    # What every estimated throughput is multiplied by: the estimator's bias
    # as running jobs measure it (build.estimator_bias; 1: none known).
    bias: float = 1.0


@dataclass
class Outcome:
    """Start and finish of every job of a draw, by job index (inf: never)."""

    start: dict[int, float]
    finish: dict[int, float]


class Fleet:
    """Free GPUs per server and per type while a draw runs."""

    def __init__(self, cluster: Cluster, free: Sequence[int]) -> None:
        self.cluster = cluster
        self.ids = [s.id for s in cluster.servers]
        self.free = list(free)
        self.by_type: dict[GpuType, list[int]] = {}
        for i, s in enumerate(cluster.servers):
            self.by_type.setdefault(s.gpu_type, []).append(i)
        self.type_free = {t: sum(self.free[i] for i in idx) for t, idx in self.by_type.items()}

    def fits(self, w: Waiting) -> bool:
        """Whether some type ``w`` runs on has its minimum requirement free."""
        low = w.reqs[-1]
        return any(self.type_free.get(g, 0) >= low for g in w.types)

    def take(self, parts: Sequence[tuple[int, int]]) -> None:
        for i, g in parts:
            self.free[i] -= g
            self.type_free[self.cluster.servers[i].gpu_type] -= g

    def give(self, parts: Sequence[tuple[int, int]]) -> None:
        for i, g in parts:
            self.free[i] += g
            self.type_free[self.cluster.servers[i].gpu_type] += g

    def best(self, w: Waiting, most: int) -> tuple[float, tuple[tuple[int, int], ...]] | None:
        """The best-throughput configuration of ``w``'s requirement set, of
        at most ``most`` GPUs, on what is free (§3.5's throughput of a
        configuration), or None."""
        est = w.estimate
        if est is None:
            return None
        found: tuple[float, tuple[tuple[int, int], ...]] | None = None
        for gpu_type in w.types:
            room = self.type_free.get(gpu_type, 0)
            for r in w.reqs:
                if r > room or r > most:
                    continue
                got = self._on_type(est, gpu_type, r, w.servers)
                if got is not None:
                    if found is None or got[0] > found[0]:
                        found = got
                    break  # the largest that fits: a smaller one is slower on this type
        return found

    def _curve(self, est: JobEstimate, i: int, gpu_type: GpuType) -> ThroughputCurve:
        own = est.by_server.get(self.ids[i]) if est.by_server else None
        return own if own is not None else est.by_type[gpu_type]

    def _on_type(self, est: JobEstimate, gpu_type: GpuType, r: int,
                 allowed: frozenset[ServerId] | None
                 ) -> tuple[float, tuple[tuple[int, int], ...]] | None:
        free, ids = self.free, self.ids
        cands = [i for i in self.by_type[gpu_type]
                 if free[i] > 0 and (allowed is None or ids[i] in allowed)]
        best_one: tuple[float, int, int] | None = None  # (-per_gpu, free, index)
        for i in cands:
            if free[i] >= r:
                key = (-self._curve(est, i, gpu_type).agg_per_gpu(r), free[i], i)
                if best_one is None or key < best_one:
                    best_one = key
        if best_one is not None:
            return -best_one[0] * r, ((best_one[2], r),)
        cands.sort(key=lambda i: (-free[i], i))
        parts: list[tuple[int, int]] = []
        need = r
        for i in cands:
            if need <= 0:
                break
            g = min(free[i], need)
            parts.append((i, g))
            need -= g
        if need > 0:
            return None
        nodes = len(parts)
        per_gpu = min(self._curve(est, i, gpu_type).dist_per_gpu(nodes) for i, _ in parts)
        if per_gpu <= 0:
            return None
        return per_gpu * r, tuple(sorted(parts))


def server_index(cluster: Cluster) -> dict[ServerId, int]:
    """Each server's index in ``cluster.servers`` (the model's server numbers)."""
    return {s.id: i for i, s in enumerate(cluster.servers)}


def jobs_order(priorities: Mapping[JobId, float], submit: Mapping[JobId, float]) -> list[JobId]:
    """The policy's order: ranked jobs highest priority first, ties by
    submission then id; unranked jobs after them by submission then id."""
    return sorted(submit, key=lambda j: (j not in priorities, -priorities.get(j, 0.0),
                                         submit[j], j))
