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

import heapq
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
    # Age (Eq. 9) and wait of each waiting job whose priority is its latency
    # ratio (Eq. 8): the order is re-ranked at each round with the waits grown.
    aging: Mapping[int, tuple[float, float]]


@dataclass
class Outcome:
    """Start and finish of every job of a draw, by job index (inf: never)."""

    start: dict[int, float]
    finish: dict[int, float]


class _Fleet:
    """Free GPUs per server and per type while a draw runs."""

    def __init__(self, cluster: Cluster, free: Sequence[int]) -> None:
        self.cluster = cluster
        self.ids = [s.id for s in cluster.servers]
        self.free = list(free)
        self.by_type: dict[GpuType, list[int]] = {}
        for i, s in enumerate(cluster.servers):
            self.by_type.setdefault(s.gpu_type, []).append(i)
        self.type_free = {t: sum(self.free[i] for i in idx) for t, idx in self.by_type.items()}

    def take(self, parts: Sequence[tuple[int, int]]) -> None:
        for i, g in parts:
            self.free[i] -= g
            self.type_free[self.cluster.servers[i].gpu_type] -= g

    def give(self, parts: Sequence[tuple[int, int]]) -> None:
        for i, g in parts:
            self.free[i] += g
            self.type_free[self.cluster.servers[i].gpu_type] += g

    def best(self, w: Waiting) -> tuple[float, tuple[tuple[int, int], ...]] | None:
        """The best-throughput configuration of ``w``'s requirement set on
        what is free (§3.5's throughput of a configuration), or None."""
        est = w.estimate
        if est is None:
            return None
        found: tuple[float, tuple[tuple[int, int], ...]] | None = None
        for gpu_type in w.types:
            room = self.type_free.get(gpu_type, 0)
            for r in w.reqs:
                if r > room:
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


def _order(model: Model, waiting: list[int], t: float) -> list[int]:
    """The waiting jobs (indices into ``model.waiting``) in the policy's order
    at ``t``: latency ratios grown by the time waited since ``now``."""
    if not model.aging:
        return waiting
    rank = {i: k for k, i in enumerate(waiting)}
    dt = t - model.now

    def key(i: int) -> tuple[float, int]:
        aged = model.aging.get(model.waiting[i].job)
        if aged is None:
            return (INF, rank[i])  # unranked: after every ranked job, as they were
        age_s, wait_s = aged
        return (-(wait_s + dt) / age_s, rank[i])

    return sorted(waiting, key=key)


def run(model: Model, factor: Mapping[int, float], *, stop_after: int | None = None) -> Outcome:
    """One draw: every job's start and finish with each estimated
    throughput multiplied by ``factor[job]`` (1.0 when absent).
    ``stop_after``: stop once that job has started (a what-if needs no more)."""
    fleet = _Fleet(model.cluster, model.free)
    start: dict[int, float] = {}
    finish: dict[int, float] = {}
    heap: list[tuple[float, int, tuple[tuple[int, int], ...]]] = []
    for p in model.placed:
        tput = p.throughput * (factor.get(p.job, 1.0) if p.estimated else 1.0)
        end = p.begin + (p.remaining / tput if tput > 0 else INF)
        finish[p.job] = end
        if end < INF:
            heapq.heappush(heap, (end, p.job, p.parts))
    waiting = list(range(len(model.waiting)))
    eligible = sorted({w.eligible_at for w in model.waiting if w.eligible_at > model.now})
    t, dirty, sorted_round = model.now, True, -1
    while waiting:
        t = _next_plan(model, t, heap, eligible, dirty)
        if t == INF:
            break
        while heap and heap[0][0] <= t:
            fleet.give(heapq.heappop(heap)[2])
        rnd = int((t - model.now) // model.round_s)
        if rnd != sorted_round:
            waiting, sorted_round = _order(model, waiting, t), rnd
        waiting = _place(model, fleet, waiting, t, factor, heap, start, finish)
        dirty = False
        if stop_after is not None and stop_after in start:
            break
    return Outcome(start, finish)


def _next_plan(model: Model, t: float, heap: list[tuple[float, int, tuple[tuple[int, int], ...]]],
               eligible: list[float], dirty: bool) -> float:
    """The next plan after ``t`` that could start a job: the round's end
    while the plan's leftovers are untried, a later plan ``fill_s`` after a
    completion (or the round boundary if that comes first), or the first
    plan after a profiling job would join the queue."""
    nxt = INF
    if dirty:
        nxt = model.next_round
    if heap:
        nxt = min(nxt, _plan_after(model, heap[0][0]))
    while eligible and eligible[0] <= t:
        eligible.pop(0)
    if eligible:
        nxt = min(nxt, _plan_after(model, eligible[0]))
    return nxt


def _plan_after(model: Model, at: float) -> float:
    """The plan that follows an event at ``at``: ``fill_s`` later, or the
    round boundary if that comes first."""
    since = max(0.0, at - model.next_round)
    boundary = model.next_round + math.ceil(since / model.round_s) * model.round_s
    return min(at + model.fill_s, boundary)


def _place(model: Model, fleet: _Fleet, waiting: list[int], t: float,
           factor: Mapping[int, float], heap: list[tuple[float, int, tuple[tuple[int, int], ...]]],
           start: dict[int, float], finish: dict[int, float]) -> list[int]:
    """The plan at ``t``: each waiting job in order takes what fits; returns
    those still waiting."""
    left: list[int] = []
    # The service window (§3.6): the head of the queue whose minimum
    # requirements first reach the GPUs this plan may give out.
    capacity, counted = sum(fleet.free), 0
    for k, i in enumerate(waiting):
        w = model.waiting[i]
        if w.eligible_at > t:
            left.append(i)
            continue
        if counted >= capacity:
            left.extend(waiting[k:])
            break
        counted += w.reqs[-1]
        room = fleet.type_free
        if not any(room.get(g, 0) >= w.reqs[-1] for g in w.types):
            left.append(i)
            continue
        got = fleet.best(w)
        if got is None:
            left.append(i)
            continue
        tput, parts = got
        fleet.take(parts)
        end = t + w.restart_s + w.remaining / (tput * factor.get(w.job, 1.0))
        start[w.job], finish[w.job] = t, end
        heapq.heappush(heap, (end, w.job, parts))
    return left


def server_index(cluster: Cluster) -> dict[ServerId, int]:
    """Each server's index in ``cluster.servers`` (the model's server numbers)."""
    return {s.id: i for i, s in enumerate(cluster.servers)}


def jobs_order(priorities: Mapping[JobId, float], submit: Mapping[JobId, float]) -> list[JobId]:
    """The policy's order: ranked jobs highest priority first, ties by
    submission then id; unranked jobs after them by submission then id."""
    return sorted(submit, key=lambda j: (j not in priorities, -priorities.get(j, 0.0),
                                         submit[j], j))
