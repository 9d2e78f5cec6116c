"""From a snapshot and the plan made from it to the forward model
(:class:`scheduling.forecast.model.Model`), and the estimator's error as
running jobs measure it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

from scheduling.forecast.arrivals import with_arrivals
from scheduling.forecast.model import Model, Placed, Waiting, jobs_order, server_index
from scheduling.rounds import restart_cost
from shared.configuration import Configuration
from shared.estimate import JobEstimate, age, config_throughput
from shared.ids import JobId, ServerId, TenantId
from shared.job import R_NUM
from shared.snapshot import JobState, Plan, PlanReasons, Snapshot

# The estimator's error (sigma of log(measured / estimated)) assumed while
# fewer than MIN_MEASURED running jobs measure it: §4.3 reports errors of
# about 10-20% for the estimator.
DEFAULT_SIGMA = 0.15
MIN_MEASURED = 3


def _log_errors(snapshot: Snapshot) -> list[float]:
    """log(measured / estimated throughput) of each running job's current
    configuration, where both are known."""
    logs: list[float] = []
    for job in snapshot.jobs:
        est = snapshot.estimates.get(job.id)
        if job.phase != "running" or job.current is None or est is None or job.throughput <= 0:
            continue
        if not job.current.total_gpus or not _covers(est, snapshot, job.current):
            continue
        predicted = config_throughput(est, snapshot.cluster, job.current)
        if predicted > 0:
            logs.append(math.log(job.throughput / predicted))
    return logs


def estimator_sigma(snapshot: Snapshot) -> float:
    """The estimator's error: the standard deviation of log(measured /
    estimated throughput) of the running jobs' current configurations
    (:data:`DEFAULT_SIGMA` while fewer than :data:`MIN_MEASURED` measure)."""
    logs = _log_errors(snapshot)
    if len(logs) < MIN_MEASURED:
        return DEFAULT_SIGMA
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def estimator_bias(snapshot: Snapshot) -> float:
    """The estimator's bias: the median ratio of measured to estimated
    throughput over the running jobs' current configurations (1 while
    fewer than :data:`MIN_MEASURED` measure). Estimates that are
    systematically high or low (an emulated cluster's time scale, a
    profile on an idle server) would move every forecast by the same
    factor; the running jobs show by how much."""
    logs = _log_errors(snapshot)
    return math.exp(statistics.median(logs)) if len(logs) >= MIN_MEASURED else 1.0


def _covers(est: JobEstimate, snapshot: Snapshot, config: Configuration) -> bool:
    by_id = snapshot.cluster.by_id
    return all(s in est.by_server or by_id[s].gpu_type in est.by_type for s in config.servers)


def _estimate(job: JobState, snapshot: Snapshot,
              by_model: Mapping[str, JobEstimate]) -> JobEstimate | None:
    """The job's estimate; a job still profiling has none yet, and is placed
    with the estimate of another job of its model (None: no such job)."""
    return snapshot.estimates.get(job.id) or by_model.get(job.spec.model)


def _ranks_by_latency(reasons: PlanReasons) -> bool:
    """Whether the policy's queue priority is the latency ratio (Eq. 8):
    then a waiting job's priority grows with its wait."""
    pri, lr = reasons.priorities, reasons.latency_ratios
    return bool(pri) and all(
        j in lr and math.isclose(p, lr[j], rel_tol=1e-9, abs_tol=1e-12) for j, p in pri.items()
    )


def build(snapshot: Snapshot, plan: Plan, *, round_s: float, fill_s: float, profile_s: float,
          next_round: float | None, r_num: int = R_NUM,
          tenant_cells: Mapping[TenantId, frozenset[ServerId]] | None = None,
          replan_rounds: int = 96, arrivals: bool = True, preempt: bool = False,
          ) -> tuple[Model, tuple[JobState, ...]]:
    """The model of ``snapshot`` after ``plan``, and the jobs it forecasts
    (GPU jobs; index i of the model is ``jobs[i]``; ``arrivals``: with the
    jobs expected to arrive, :mod:`scheduling.forecast.arrivals`)."""
    now, cluster = snapshot.now, snapshot.cluster
    jobs = tuple(j for j in snapshot.jobs if j.spec.kind != "cpu")
    chosen = {a.job_id: a for a in plan.assignments}
    sidx = server_index(cluster)
    free = [0] * len(cluster.servers)
    for sid, g in snapshot.free_gpus().items():
        free[sidx[sid]] = g
    by_model = _by_model(snapshot, jobs)
    placed: list[Placed] = []
    waiting: dict[JobId, Waiting] = {}
    specs: list[Waiting | None] = []
    for i, job in enumerate(jobs):
        a = chosen.get(job.id)
        spec = _waiting(i, job, snapshot, by_model, profile_s, r_num, tenant_cells)
        specs.append(spec)
        running = job.phase == "running" and job.current is not None
        if running and not snapshot.first_plan and (a is None or _same_gpus(job, a.config)):
            assert job.current is not None
            placed.append(_kept(i, job, job.current, snapshot, sidx, spec))
        elif a is not None:
            if not (running and not snapshot.first_plan):
                for sid, g in a.config.parts:
                    free[sidx[sid]] -= g
            if running and _same_gpus(job, a.config):
                placed.append(_kept(i, job, a.config, snapshot, sidx, spec))
            else:
                placed.append(_started(i, job, a.config, a.throughput, snapshot, sidx, spec))
        elif spec is not None:
            waiting[job.id] = spec
    pri = plan.reasons.priorities
    order = jobs_order(pri, {j.id: j.spec.submit_time for j in jobs})
    index = {j.id: i for i, j in enumerate(jobs)}
    model = Model(cluster=cluster, now=now, round_s=round_s, fill_s=fill_s,
                  next_round=now + round_s if next_round is None else next_round,
                  free=tuple(max(0, f) for f in free), placed=tuple(placed),
                  waiting=tuple(waiting[j] for j in order if j in waiting),
                  aging=_aging(snapshot, plan.reasons, jobs, r_num),
                  priority={index[j]: p for j, p in pri.items() if j in index},
                  rank={index[j]: k for k, j in enumerate(order)},
                  replan_rounds=replan_rounds, preempt=preempt,
                  bias=estimator_bias(snapshot))
    return (with_arrivals(model, jobs, specs) if arrivals else model), jobs


def _by_model(snapshot: Snapshot, jobs: tuple[JobState, ...]) -> dict[str, JobEstimate]:
    """One estimate per model (the first job's by id): a profiling job's stand-in."""
    out: dict[str, JobEstimate] = {}
    for j in sorted(jobs, key=lambda j: j.id):
        est = snapshot.estimates.get(j.id)
        if est is not None:
            out.setdefault(j.spec.model, est)
    return out


def _same_gpus(job: JobState, config: Configuration) -> bool:
    return job.current is not None and job.current.parts == config.parts


def _kept(i: int, job: JobState, config: Configuration, snapshot: Snapshot,
          sidx: Mapping[ServerId, int], again: Waiting | None) -> Placed:
    """A running job that keeps its GPUs: at its measured rate from when its
    restart ended (the estimate's rate while it is not measured)."""
    parts = tuple((sidx[s], g) for s, g in config.parts)
    begin = max(snapshot.now, job.throughput_since)
    if job.throughput > 0:
        return Placed(i, parts, begin, job.remaining_samples, job.throughput, False, again)
    est = snapshot.estimates.get(job.id)
    tput = config_throughput(est, snapshot.cluster, config) if est is not None else 0.0
    return Placed(i, parts, begin, job.remaining_samples, tput, True, again)


def _started(i: int, job: JobState, config: Configuration, planned: float,
             snapshot: Snapshot, sidx: Mapping[ServerId, int], again: Waiting | None) -> Placed:
    """A job the plan (re)starts: progress after its restart cost, at the
    plan's throughput (the estimate's when the plan gives none)."""
    est = snapshot.estimates.get(job.id)
    tput = planned
    if tput <= 0 and est is not None and _covers(est, snapshot, config):
        tput = config_throughput(est, snapshot.cluster, config)
    parts = tuple((sidx[s], g) for s, g in config.parts)
    return Placed(i, parts, snapshot.now + restart_cost(job), job.remaining_samples, tput, True,
                  again)


def _waiting(i: int, job: JobState, snapshot: Snapshot, by_model: Mapping[str, JobEstimate],
             profile_s: float, r_num: int,
             tenant_cells: Mapping[TenantId, frozenset[ServerId]] | None) -> Waiting | None:
    est = _estimate(job, snapshot, by_model)
    if est is None:
        return None
    names = {t.name for t in snapshot.cluster.gpu_types}
    types = tuple(sorted(t for t, c in est.by_type.items()
                         if t in names and c.agg and c.agg[0] > 0))
    reqs = tuple(sorted(job.spec.requirement_set(r_num), reverse=True))
    if not types or not reqs:
        return None
    cells = tenant_cells.get(job.spec.tenant) if tenant_cells is not None else None
    eligible = snapshot.now + (profile_s if job.phase == "profiling" else 0.0)
    return Waiting(i, reqs, est, types, job.remaining_samples, restart_cost(job), eligible, cells)


def _aging(snapshot: Snapshot, reasons: PlanReasons, jobs: tuple[JobState, ...],
           r_num: int) -> dict[int, tuple[float, float]]:
    """(age, wait) of each ranked job when the policy ranks by the latency
    ratio (Eq. 8: wait / age, Eq. 9); empty otherwise (the plan's
    priorities hold)."""
    if not _ranks_by_latency(reasons):
        return {}
    out: dict[int, tuple[float, float]] = {}
    for i, job in enumerate(jobs):
        est = snapshot.estimates.get(job.id)
        if est is None or job.id not in reasons.priorities:
            continue
        reqs = job.spec.requirement_set(r_num)
        a = age(est, snapshot.cluster, job.spec.total_samples, sum(reqs) / len(reqs))
        if math.isfinite(a) and a > 0:
            out[i] = (a, job.wait_s)
    return out
