"""The forecast of a whole queue (:func:`forecast`): positions, start and
finish with their 10th-90th percentile intervals, and what-if alternatives
(docs/explain.md, "Forecasts")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from scheduling.forecast.build import build, estimator_sigma
from scheduling.forecast.calibration import Calibration, Interval, apply, corrections
from scheduling.forecast.forward import run
from scheduling.forecast.model import Model, Outcome, Waiting
from shared.explain import JobForecast, QueueForecast, WhatIf
from shared.ids import JobId, ServerId, TenantId
from shared.job import R_NUM
from shared.snapshot import JobState, Plan, Snapshot

LO_Q, HI_Q = 0.1, 0.9
# Seconds after a release that the mechanism plans again (the simulator's
# fill_delay_s; the paper refreshes its queue every 30 s).
FILL_S = 30.0
# Seconds a job's profiling runs take before it joins the queue (§3.2: a
# few iterations per GPU type).
PROFILE_S = 60.0
# What-ifs are worked out for this many waiting jobs, the head of the queue.
WHATIF_JOBS = 10
# Rounds whose first plan the model replans (ranks again, grows jobs); later
# ones only serve the queue, which bounds a forecast's cost on a deep queue.
REPLAN_ROUNDS = 96


def forecast(snapshot: Snapshot, plan: Plan, *, round_s: float, seed: int = 0,
             draws: int = 8, whatif: bool = True, calibration: Calibration | None = None,
             tenant_cells: Mapping[TenantId, frozenset[ServerId]] | None = None,
             whatif_jobs: int = WHATIF_JOBS, fill_s: float = FILL_S,
             profile_s: float = PROFILE_S, next_round: float | None = None,
             r_num: int = R_NUM, sigma: float | None = None,
             started: Mapping[JobId, float] | None = None,
             replan_rounds: int = REPLAN_ROUNDS, arrivals: bool = True,
             preempt: bool = False) -> QueueForecast:
    """The forecast of every GPU job of ``snapshot`` after ``plan`` (made
    from it), from ``draws`` draws of the throughputs, each estimated one
    multiplied by a lognormal factor of sigma ``sigma`` (default: the
    estimator's error, :func:`estimator_sigma`), seeded by ``seed``.
    ``calibration`` corrects the intervals (:func:`calibrated`);
    ``tenant_cells`` restricts each named tenant's jobs to its servers
    (HiveD), which makes the opportunistic what-if possible; ``started``
    gives running jobs' start times (unknown: now); the first
    ``replan_rounds`` rounds' first plans rank everyone again (and
    preempt, with ``preempt``); ``arrivals`` adds the jobs expected to
    arrive (:mod:`scheduling.forecast.arrivals`). Jobs the model cannot
    place (no estimate of their model, no GPU type) are left out."""
    model, jobs = build(snapshot, plan, round_s=round_s, fill_s=fill_s, profile_s=profile_s,
                        next_round=next_round, r_num=r_num, tenant_cells=tenant_cells,
                        replan_rounds=replan_rounds, arrivals=arrivals, preempt=preempt)
    s = estimator_sigma(snapshot) if sigma is None else sigma
    point = run(model, {})
    outs = [point, *(run(model, f) for f in _factors(model, len(jobs), s, seed, draws))]
    now = snapshot.now
    entries: list[JobForecast] = []
    first = started or {}
    for p in model.placed:
        job = jobs[p.job]
        fin = _interval(outs, p.job, finish=True)
        if fin is None:
            continue
        at = first.get(job.id, now)
        entries.append(JobForecast(job_id=job.id, position=0, tenant_position=0, start=at,
                                   start_lo=at, start_hi=at, finish=fin.point,
                                   finish_lo=fin.lo, finish_hi=fin.hi))
    entries += _waiting_entries(model, jobs, outs)
    out = QueueForecast(at=now, jobs=tuple(entries), draws=draws)
    if whatif:
        out = _with_whatifs(out, model, jobs, point, whatif_jobs, tenant_cells is not None)
    return calibrated(out, calibration, round_s) if calibration is not None else out


def _factors(model: Model, n: int, sigma: float, seed: int,
             draws: int) -> list[dict[int, float]]:
    """Each draw's throughput factor per job: lognormal, median 1."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((draws, n))
    return [{i: float(math.exp(sigma * z[d, i])) for i in range(n)} for d in range(draws)]


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    x = q * (len(ordered) - 1)
    k = int(x)
    if k + 1 >= len(ordered):
        return ordered[-1]
    lo, hi = ordered[k], ordered[k + 1]
    return lo if hi == lo else lo + (hi - lo) * (x - k)


def _interval(outs: Sequence[Outcome], job: int, *, finish: bool) -> Interval | None:
    """The point (the draw without noise) and the 10th-90th percentiles of
    the draws; None if the point never starts the job."""
    values = [(o.finish if finish else o.start).get(job, math.inf) for o in outs]
    if not math.isfinite(values[0]):
        return None
    lo, hi = _quantile(values, LO_Q), _quantile(values, HI_Q)
    lo, hi = min(lo, values[0]), max(hi, values[0])
    return Interval(lo, values[0], hi if math.isfinite(hi) else max(
        v for v in values if math.isfinite(v)))


def _waiting_entries(model: Model, jobs: Sequence[JobState],
                     outs: Sequence[Outcome]) -> list[JobForecast]:
    """The waiting jobs in the policy's order: position 1 is the head."""
    entries: list[JobForecast] = []
    by_tenant: dict[str, int] = {}
    for w in model.waiting:
        if w.job >= len(jobs):
            continue  # a job expected to arrive
        start = _interval(outs, w.job, finish=False)
        fin = _interval(outs, w.job, finish=True)
        if start is None or fin is None:
            continue
        job = jobs[w.job]
        by_tenant[job.spec.tenant] = by_tenant.get(job.spec.tenant, 0) + 1
        entries.append(JobForecast(
            job_id=job.id, position=len(entries) + 1, tenant_position=by_tenant[job.spec.tenant],
            start=start.point, start_lo=start.lo, start_hi=start.hi,
            finish=fin.point, finish_lo=fin.lo, finish_hi=fin.hi))
    return entries


def calibrated(qf: QueueForecast, cal: Calibration, round_s: float) -> QueueForecast:
    """``qf`` with every waiting job's intervals corrected by ``cal``
    (a running job's are kept)."""
    out: list[JobForecast] = []
    starts, finishes = corrections(cal, "start"), corrections(cal, "finish")
    for f in qf.jobs:
        if not f.position:
            # A running job's finish rests on its measured rate; the residuals
            # are those of waiting jobs, whose error is mostly the wait.
            out.append(f)
            continue
        fin = apply(finishes, "finish", qf.at,
                    Interval(f.finish_lo, f.finish, f.finish_hi, f.position), round_s)
        st = apply(starts, "start", qf.at,
                   Interval(f.start_lo, f.start, f.start_hi, f.position), round_s)
        # A job cannot finish before it starts, whatever each correction did.
        fin = Interval(max(fin.lo, st.lo), max(fin.point, st.point), max(fin.hi, st.hi))
        f = msgspec.structs.replace(f, start=st.point, start_lo=st.lo, start_hi=st.hi)
        out.append(msgspec.structs.replace(f, finish=fin.point, finish_lo=fin.lo,
                                           finish_hi=fin.hi))
    return msgspec.structs.replace(qf, jobs=tuple(out))


def _with_whatifs(qf: QueueForecast, model: Model, jobs: Sequence[JobState], point: Outcome,
                  limit: int, cells: bool) -> QueueForecast:
    """``qf`` with the what-ifs of its first ``limit`` waiting jobs."""
    index = {w.job: k for k, w in enumerate(model.waiting)}
    by_id = {j.id: i for i, j in enumerate(jobs)}
    out: list[JobForecast] = []
    for f in qf.jobs:
        if 0 < f.position <= limit:
            k = index[by_id[f.job_id]]
            found = whatifs(model, k, point.start[model.waiting[k].job], cells)
            f = msgspec.structs.replace(f, whatif=found)
        out.append(f)
    return msgspec.structs.replace(qf, jobs=tuple(out))


def _variants(w: Waiting, cells: bool) -> list[tuple[WhatIf, Waiting]]:
    """The alternatives of ``w`` (their times filled in by :func:`whatifs`)."""
    out: list[tuple[WhatIf, Waiting]] = []
    # The model serves a job's smallest requirement whenever it fits, so
    # "its smallest requirement only" would never start earlier there: the
    # smaller set offered is half of it.
    if w.reqs[-1] > 1:
        g = w.reqs[-1] // 2
        out.append((WhatIf(kind="smaller", message=f"with only {g} GPU{'s' if g > 1 else ''}",
                           start=0.0, finish=0.0, max_gpus=g),
                    dataclasses.replace(w, reqs=(g,))))
    if len(w.types) > 1:
        out += [(WhatIf(kind="gpu_type", message=f"only on {t}", start=0.0, finish=0.0,
                        gpu_type=t), dataclasses.replace(w, types=(t,))) for t in w.types]
    if cells and w.servers is not None:
        out.append((WhatIf(kind="opportunistic", message="as an opportunistic job in idle cells",
                           start=0.0, finish=0.0), dataclasses.replace(w, servers=None)))
    return out


def whatifs(model: Model, k: int, own_start: float, cells: bool) -> tuple[WhatIf, ...]:
    """Up to three alternatives for the ``k``-th waiting job of ``model``,
    one per kind (the earliest), each kept only if it starts at least one
    round before ``own_start``."""
    w = model.waiting[k]
    best: dict[str, WhatIf] = {}
    for alt, changed in _variants(w, cells):
        waiting = (*model.waiting[:k], changed, *model.waiting[k + 1:])
        got = run(dataclasses.replace(model, waiting=waiting), {}, stop_after=w.job)
        start = got.start.get(w.job, math.inf)
        if start > own_start - model.round_s:
            continue
        prev = best.get(alt.kind)
        if prev is None or start < prev.start:
            best[alt.kind] = msgspec.structs.replace(alt, start=start, finish=got.finish[w.job])
    return tuple(best.values())
