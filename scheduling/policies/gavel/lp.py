"""Gavel's allocation LP: heterogeneity-aware, priority-weighted max-min
fairness over time fractions (Narayanan et al., OSDI'20: policies written
over "effective throughput", the LAS / max-min fairness policy).

``X[j][t]`` is the fraction of wall-clock time job ``j`` should run on GPU
type ``t`` with its rigid ``n_j`` GPUs. With ``T[j][t]`` the job's throughput
on ``n_j`` GPUs of type ``t`` (Gavel's throughput matrix), the LP is

    maximise z
    s.t.  sum_t n_j * T[j][t] / P_j * X[j][t] / w_j >= z   for every job j
          sum_t X[j][t] <= 1                              for every job j
          sum_j n_j * X[j][t] <= G_t                      for every type t
          X >= 0

where ``G_t`` is the number of GPUs of type ``t`` this round, ``w_j`` the
job's priority weight and ``P_j = sum_t T[j][t] * G_t / G`` the throughput of
Gavel's proportional allocation (every job an equal time share of each type;
``policies/proportional.py`` rescales that share to ``G_t / G``). The left of
the first row is Gavel's normalised effective throughput times the scale
factor ``n_j`` (``policies/max_min_fairness.py``, ``MaxMinFairnessPolicyWithPerf``),
which makes jobs of different sizes receive equal GPU time, not equal time.

The max-min optimum is rarely unique and Gavel returns whatever point its
interior-point solver lands on; a simplex vertex could leave GPUs idle in
``X``. A second LP therefore keeps every job at the optimum ``z*`` and
maximises the sum of normalised effective throughputs, a deterministic,
Pareto-efficient point of the optimal face. Gavel's own remedy,
``policies/max_min_fairness_water_filling.py``, raises the non-bottleneck jobs
level by level with one LP and one MILP per level; one extra LP is cheaper and
keeps the allocation fast for hundreds of jobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduling.ilp import INF, MipModel, MipOptions, solve_mip
from shared.cluster import Cluster
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId
from shared.job import JobSpec

# Relative slack on z* in the second LP: room for HiGHS's feasibility
# tolerance, far below anything that changes a round's priorities.
Z_SLACK = 1e-8
# Time fractions below this are solver noise, not a share to serve.
X_EPS = 1e-9
# A weight near zero would make the job's row coefficients explode.
WEIGHT_FLOOR = 1e-6


def rigid_requirement(spec: JobSpec, r_num: int) -> int:
    """Hops §4.2: the median of the requirement set is the job's rigid size;
    for an even-sized set the lower median, so the job fits more often."""
    reqs = spec.requirement_set(r_num)
    return reqs[(len(reqs) - 1) // 2]


def type_throughput(est: JobEstimate, cluster: Cluster, gpu_type: GpuType, gpus: int) -> float:
    """The job's samples/s on ``gpus`` GPUs of ``gpu_type`` from the type
    curve alone (Gavel's heterogeneity stops at the GPU type): aggregated
    when ``gpus`` fits the type's largest server, else distributed over the
    fewest servers that hold it."""
    curve = est.by_type.get(gpu_type)
    per_server = cluster.max_server_gpus(gpu_type)
    if curve is None or per_server <= 0 or gpus <= 0:
        return 0.0
    if gpus <= per_server:
        return curve.agg_per_gpu(gpus) * gpus
    return curve.dist_per_gpu(math.ceil(gpus / per_server)) * gpus


@dataclass(frozen=True, slots=True)
class LpJob:
    """One row of the throughput matrix with its scale factor and weight."""

    job_id: JobId
    gpus: int
    weight: float
    throughput: Mapping[GpuType, float]


@dataclass(frozen=True)
class Allocation:
    """The LP's answer. ``fractions`` lists every job given to the LP, with
    zeros where it got nothing; ``runnable`` the types that had a column for
    the job (positive throughput, rigid size within the type's GPUs; none
    when the job can run nowhere and stayed out); ``proportional`` is ``P_j``."""

    fractions: dict[JobId, dict[GpuType, float]]
    runnable: dict[JobId, tuple[GpuType, ...]]
    proportional: dict[JobId, float]
    objective: float
    columns: int
    solve_s: float
    status: str


@dataclass(frozen=True, slots=True)
class _Column:
    job: int
    gpu_type: GpuType
    neff: float  # n_j * T[j][t] / P_j: normalised effective throughput per unit of X


def proportional_throughput(job: LpJob, capacity: Mapping[GpuType, int]) -> float:
    """``P_j``: throughput under Gavel's proportional time shares ``G_t / G``."""
    total = sum(capacity.values())
    if total <= 0:
        return 0.0
    return sum(job.throughput.get(t, 0.0) * g / total for t, g in capacity.items())


def _columns(
    jobs: Sequence[LpJob], capacity: Mapping[GpuType, int], prop: Sequence[float]
) -> list[_Column]:
    cols: list[_Column] = []
    for i, job in enumerate(jobs):
        if prop[i] <= 0:
            continue
        for t, g in capacity.items():
            tput = job.throughput.get(t, 0.0)
            if tput > 0 and job.gpus <= g:
                cols.append(_Column(i, t, job.gpus * tput / prop[i]))
    return cols


def _model(
    jobs: Sequence[LpJob],
    capacity: Mapping[GpuType, int],
    cols: Sequence[_Column],
    z_floor: float | None,
) -> MipModel:
    """Stage 1 (``z_floor`` None) maximises z; stage 2 keeps ``z >= z_floor``
    and maximises the total normalised effective throughput."""
    model = MipModel()
    in_lp = sorted({c.job for c in cols})
    time_row = {i: model.add_row(-INF, 1.0) for i in in_lp}
    type_row = {t: model.add_row(-INF, float(g)) for t, g in capacity.items()}
    fair_row = {i: model.add_row(0.0, INF) for i in in_lp}
    for c in cols:
        job = jobs[c.job]
        weight = max(job.weight, WEIGHT_FLOOR)
        model.add_col(
            0.0 if z_floor is None else c.neff,
            0.0,
            1.0,
            integer=False,
            rows=[time_row[c.job], type_row[c.gpu_type], fair_row[c.job]],
            values=[1.0, float(job.gpus), c.neff / weight],
        )
    rows = [fair_row[i] for i in in_lp]
    if z_floor is None:
        model.add_col(1.0, 0.0, INF, integer=False, rows=rows, values=[-1.0] * len(rows))
    else:
        model.add_col(0.0, z_floor, INF, integer=False, rows=rows, values=[-1.0] * len(rows))
    return model


def max_min_allocation(
    jobs: Sequence[LpJob],
    capacity: Mapping[GpuType, int],
    options: MipOptions | None = None,
) -> Allocation:
    """Solve the two LPs of the module docstring with HiGHS.

    ``capacity`` maps each type to its GPUs this round, in the order the
    columns are laid out (keep it fixed for determinism)."""
    options = options or MipOptions()
    cap = {t: g for t, g in capacity.items() if g > 0}
    prop = [proportional_throughput(j, cap) for j in jobs]
    cols = _columns(jobs, cap, prop)
    fractions = {j.job_id: {t: 0.0 for t in capacity} for j in jobs}
    runnable: dict[JobId, tuple[GpuType, ...]] = {j.job_id: () for j in jobs}
    for c in cols:
        runnable[jobs[c.job].job_id] += (c.gpu_type,)
    proportional = {j.job_id: p for j, p in zip(jobs, prop, strict=True)}
    if not cols:
        return Allocation(fractions, runnable, proportional, 0.0, 0, 0.0, "Empty")
    first = solve_mip(_model(jobs, cap, cols, None), options, maximize=True)
    if not first.has_solution:
        return Allocation(
            fractions, runnable, proportional, 0.0, len(cols), first.solve_s, first.status
        )
    z_star = float(first.values[-1])
    values, solve_s = first.values, first.solve_s
    second = solve_mip(_model(jobs, cap, cols, z_star * (1.0 - Z_SLACK)), options, maximize=True)
    if second.has_solution:
        values, solve_s = second.values, solve_s + second.solve_s
    for k, c in enumerate(cols):
        x = min(1.0, float(values[k]))
        fractions[jobs[c.job].job_id][c.gpu_type] = x if x > X_EPS else 0.0
    return Allocation(
        fractions, runnable, proportional, z_star, len(cols) + 1, solve_s, first.status
    )


def fastest_first(jobs: Sequence[LpJob], types: Sequence[GpuType]) -> list[GpuType]:
    """Gavel scans its types in a fixed fastest-first order (``["v100",
    "p100", "k80"]`` in ``scheduler.py``). Here a type's speed is the mean
    over jobs of its throughput relative to the job's best type; the given
    order breaks ties."""
    speed = dict.fromkeys(types, 0.0)
    for job in jobs:
        best = max((job.throughput.get(t, 0.0) for t in types), default=0.0)
        if best <= 0:
            continue
        for t in types:
            speed[t] += job.throughput.get(t, 0.0) / best
    rank = {t: i for i, t in enumerate(types)}
    return sorted(types, key=lambda t: (-speed[t], rank[t]))
