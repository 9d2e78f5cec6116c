"""One draw of the forward model (:func:`run`): the plan's jobs run, and at
each later plan the waiting jobs are served in the policy's order.

- A later plan runs :attr:`Model.fill_s` after a completion (or at the
  round's end if that comes first) and in passes, as Hops plans (§3.6): the
  service window over the free GPUs, leaving out jobs nothing free could
  serve; each window job takes the best-throughput configuration of its
  requirement set that fits (the largest that fits, on the best type).
- A round's first plan (the first :attr:`Model.replan_rounds` rounds) ranks
  running and waiting jobs together, latency ratios grown by the time
  waited when the policy ranks by them; with :attr:`Model.preempt`,
  running jobs outside the window over all GPUs (less Hops' hysteresis)
  are preempted (their progress kept, a restart when they resume); then the
  window is served as above, and GPUs still idle grow running jobs. Hops
  re-solves its ILP there (docs/explain.md, "Forecasts").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduling.forecast.model import INF, Fleet, Model, Outcome, Waiting

# Passes of one plan: the first and at most four fill passes, as Hops plans
# (HopsSettings.max_fill_passes).
PASSES = 5
# HopsSettings.preempt_margin's default: the share of the top priority a
# running job is credited with against the window (docs/design.md, "Hysteresis").
KEEP_MARGIN = 0.02


@dataclass
class _Held:
    """A job holding GPUs in a draw."""

    parts: tuple[tuple[int, int], ...]
    begin: float  # progress from here
    remaining: float  # samples left at ``begin``
    throughput: float
    spec: Waiting | None  # how it waits again (None: not preemptible)


@dataclass
class _Draw:
    model: Model
    factor: Mapping[int, float]
    fleet: Fleet
    start: dict[int, float] = field(default_factory=dict)
    finish: dict[int, float] = field(default_factory=dict)
    heap: list[tuple[float, int, int]] = field(default_factory=list)  # (end, job, version)
    held: dict[int, _Held] = field(default_factory=dict)
    version: dict[int, int] = field(default_factory=dict)
    waiting: dict[int, Waiting] = field(default_factory=dict)  # job -> how it waits
    remaining: dict[int, float] = field(default_factory=dict)
    waited: dict[int, float] = field(default_factory=dict)  # wait before ``since``
    since: dict[int, float] = field(default_factory=dict)  # waiting since
    order: list[int] = field(default_factory=list)  # waiting jobs, policy order

    def hold(self, job: int, parts: tuple[tuple[int, int], ...], begin: float,
             remaining: float, tput: float, spec: Waiting | None) -> None:
        self.fleet.take(parts)
        end = begin + (remaining / tput if tput > 0 else INF)
        self.finish[job] = end
        v = self.version[job] = self.version.get(job, 0) + 1
        self.held[job] = _Held(parts, begin, remaining, tput, spec)
        if end < INF:
            heapq.heappush(self.heap, (end, job, v))

    def preempt(self, job: int, t: float) -> None:
        h = self.held.pop(job)
        assert h.spec is not None
        self.fleet.give(h.parts)
        self.version[job] += 1
        self.remaining[job] = max(0.0, h.remaining - max(0.0, t - h.begin) * h.throughput)
        self.waiting[job] = h.spec
        self.since[job] = t
        del self.finish[job]

    def complete_until(self, t: float) -> None:
        while self.heap and self.heap[0][0] <= t:
            _, job, v = heapq.heappop(self.heap)
            if self.version.get(job) == v:
                self.fleet.give(self.held.pop(job).parts)

    def priority(self, job: int, t: float) -> tuple[float, int]:
        """Sort key at ``t``: the highest priority first, unranked last."""
        m = self.model
        rank = m.rank.get(job, len(m.rank) + job)
        if m.aging:
            aged = m.aging.get(job)
            if aged is None:
                return (INF, rank)
            wait = aged[1] + self.waited.get(job, 0.0)
            if job in self.waiting:
                wait += t - self.since[job]
            return (-wait / aged[0], rank)
        p = m.priority.get(job)
        return (INF, rank) if p is None else (-p, rank)


def run(model: Model, factor: Mapping[int, float], *, stop_after: int | None = None) -> Outcome:
    """One draw: every job's start (its first after ``now``) and finish, each
    estimated throughput multiplied by ``factor[job]`` (1.0 when absent).
    ``stop_after``: stop once that job has started (a what-if needs no more)."""
    d = _Draw(model, factor, Fleet(model.cluster, model.free))
    for p in model.placed:
        tput = p.throughput * (factor.get(p.job, 1.0) * model.bias if p.estimated else 1.0)
        d.fleet.give(p.parts)  # ``model.free`` is what the plan leaves: hold() takes them again
        d.hold(p.job, p.parts, p.begin, p.remaining, tput, p.again)
    for w in model.waiting:
        # A job expected to arrive waits from its arrival (its eligibility).
        d.waiting[w.job], d.remaining[w.job] = w, w.remaining
        d.since[w.job] = max(model.now, w.eligible_at)
    d.order = [w.job for w in model.waiting]
    eligible = sorted({w.eligible_at for w in model.waiting if w.eligible_at > model.now})
    t, dirty = model.now, True
    last_round = model.now + model.replan_rounds * model.round_s
    while d.waiting:
        t = _next_plan(model, t, d, eligible, dirty, last_round)
        if t == INF:
            break
        d.complete_until(t)
        boundary = _is_boundary(model, t)
        replan = boundary and t <= last_round
        if replan:
            _replan(d, t)
        _place(d, t)
        if replan:
            _grow(d, t)
        dirty = False
        if stop_after is not None and stop_after in d.start:
            break
    return Outcome(d.start, d.finish)


def _is_boundary(model: Model, t: float) -> bool:
    k = (t - model.next_round) / model.round_s
    return k >= -1e-9 and abs(k - round(k)) < 1e-9


def _next_plan(model: Model, t: float, d: _Draw, eligible: list[float], dirty: bool,
               last_round: float) -> float:
    """The next plan after ``t`` that could change anything: the next round
    boundary while rounds are replanned (or while the plan's leftovers are
    untried), a later plan after a completion, or the first plan after a
    profiling job would join the queue."""
    nxt = INF
    if dirty or t < last_round:
        nxt = _boundary_after(model, t)
    while d.heap and d.version.get(d.heap[0][1]) != d.heap[0][2]:
        heapq.heappop(d.heap)  # a preempted job's old completion
    if d.heap:
        nxt = min(nxt, _plan_after(model, d.heap[0][0]))
    while eligible and eligible[0] <= t:
        eligible.pop(0)
    if eligible:
        nxt = min(nxt, _plan_after(model, eligible[0]))
    return nxt


def _boundary_after(model: Model, t: float) -> float:
    """The first round boundary strictly after ``t``."""
    if t < model.next_round:
        return model.next_round
    k = math.floor((t - model.next_round) / model.round_s + 1e-9) + 1
    return model.next_round + k * model.round_s


def _plan_after(model: Model, at: float) -> float:
    """The plan that follows an event at ``at``: ``fill_s`` later, or the
    round boundary if that comes first."""
    boundary = at if _is_boundary(model, at) else _boundary_after(model, at)
    return min(at + model.fill_s, boundary)


def _replan(d: _Draw, t: float) -> None:
    """A round's first plan: everyone ranked at ``t``; running jobs outside
    the window over all GPUs give theirs back."""
    ranked = sorted([*d.held, *(j for j, w in d.waiting.items() if w.eligible_at <= t)],
                    key=lambda j: d.priority(j, t))
    capacity = sum(d.fleet.free) + sum(g for h in d.held.values() for _, g in h.parts)
    counted, inside = 0, set()
    for job in ranked:
        if counted >= capacity:
            break
        inside.add(job)
        h = d.held.get(job)
        counted += sum(g for _, g in h.parts) if h is not None else d.waiting[job].reqs[-1]
    # Hops' hysteresis (HopsSettings.preempt_margin): a running job outside
    # the window keeps its GPUs while its priority, plus the margin of the
    # top one, reaches the window's lowest.
    keys = {j: -d.priority(j, t)[0] for j in ranked}
    finite = [k for k in keys.values() if math.isfinite(k)]
    top = max(finite, default=0.0)
    low = min((keys[j] for j in inside if math.isfinite(keys[j])), default=-INF)
    for job in [j for j, h in d.held.items() if j not in inside and h.spec is not None]:
        if d.model.preempt and keys.get(job, -INF) + KEEP_MARGIN * top < low:
            d.preempt(job, t)
    d.order = [j for j in ranked if j in d.waiting] + [
        j for j in d.order if j in d.waiting and d.waiting[j].eligible_at > t]


def _window(d: _Draw, t: float) -> list[int]:
    """The service window (§3.6) of one pass at ``t``: the head of the
    eligible queue, leaving out jobs nothing free could serve (as Hops
    leaves them out), whose minimum requirements first reach the free GPUs."""
    capacity = sum(d.fleet.free)
    window: list[int] = []
    counted = 0
    for job in d.order:
        if counted >= capacity:
            break
        w = d.waiting[job]
        if w.eligible_at <= t and d.fleet.fits(w):
            window.append(job)
            counted += w.reqs[-1]
    return window


def _place(d: _Draw, t: float) -> None:
    """The plan at ``t``, pass by pass: each job of the window in order
    takes the best-throughput configuration of its requirement set that fits
    what is free (the largest that fits, on the best type)."""
    for _ in range(PASSES):
        placed: set[int] = set()
        for job in _window(d, t):
            w = d.waiting[job]
            got = d.fleet.best(w, w.reqs[0]) if d.fleet.fits(w) else None
            if got is None:
                continue
            tput, parts = got
            del d.waiting[job]
            d.waited[job] = d.waited.get(job, 0.0) + t - d.since.pop(job, t)
            d.start.setdefault(job, t)
            d.hold(job, parts, t + w.restart_s, d.remaining[job],
                   tput * d.factor.get(job, 1.0) * d.model.bias, w)
            placed.add(job)
        if not placed:
            break
        d.order = [j for j in d.order if j not in placed]
        if not any(d.fleet.free):
            break


# A running job moves to a larger configuration only for this much more
# throughput: the restart must pay (Hops weighs a reconfiguration's cost).
GROW_GAIN = 1.2


def _grow(d: _Draw, t: float) -> None:
    """After a round's first plan served the queue: GPUs still free go to
    running jobs, in rank order, as larger configurations of their
    requirement sets (the policy grows jobs when the queue leaves GPUs idle)."""
    for job in sorted(d.held, key=lambda j: d.priority(j, t)):
        if not any(d.fleet.free):
            return
        h = d.held[job]
        if h.spec is None or t < h.begin:
            continue
        gpus = sum(g for _, g in h.parts)
        if gpus >= h.spec.reqs[0]:
            continue
        d.fleet.give(h.parts)
        got = d.fleet.best(h.spec, h.spec.reqs[0])
        d.fleet.take(h.parts)
        if got is None or got[0] * d.factor.get(job, 1.0) * d.model.bias < GROW_GAIN * h.throughput:
            continue
        left = max(0.0, h.remaining - (t - h.begin) * h.throughput)
        d.fleet.give(h.parts)
        del d.held[job]
        d.hold(job, got[1], t + h.spec.restart_s, left,
               got[0] * d.factor.get(job, 1.0) * d.model.bias, h.spec)
