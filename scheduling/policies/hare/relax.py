"""Step 1 of Hare's Algorithm 1 (hare.md §5.2, line 3): the relaxation whose
start times order the tasks.

What is solved
--------------
The paper's Hare_Sched_RL keeps the assignment ``y`` binary and multiplies it
with the start times ``x`` in (6), (7) and (9): a mixed-integer quadratic
program. This module solves a linear program instead, in the start time
``x_i`` of every remaining task, one barrier ``b_{n,r}`` per remaining round
and the completion time ``C_n = b_{n,last}`` of every job::

    min  Σ_n w_n C_n
    s.t. x_i >= e_i                                 (4), strengthened below
         b_{n,r} >= x_i + T_n^min     i ∈ D_r       (6)/(7), first half
         x_j >= b_{n,r}               j ∈ D_{r+1}   (7), second half
         Σ_{i∈A} p_i x_i >= Q(A)      A = all tasks, and A = each job's tasks  (9')

``T_n^min = min_t (T^c_{n,t} + T^s_{n,t})`` over the GPU types of the
problem that can run job n: whatever GPU a task gets, it is done no earlier
than ``T_n^min`` after its start, so the per-round barrier makes (6) and (7)
hold with O(tasks) rows instead of |D_r|^2. ``e_i`` is the job's release
(arrival, ``now``, ``ready_s``), raised to the earliest ``free_s`` of the
GPUs that can run it, since the task starts on one of them.

(9') is the parallel-machine form of (9) with the shortened processing times
``p_i = T^{c,min}_i`` (the task's fastest compute time). Let
``g_m = max(ρ_A, free_s_m)`` with ``ρ_A`` the earliest release of A, ``M_A``
the GPUs able to run a task of A, ``A_m`` the tasks of A a feasible schedule
puts on GPU m and ``P_m = Σ_{i∈A_m} p_i``. On GPU m every task of A starts at
or after ``g_m`` and the intervals ``[x_i, x_i + p_i)`` are disjoint, since
each lies inside its task's real ``[x_i, x_i + T^c_{i,m})`` and (8) keeps
those apart. Ordering ``A_m`` by start, ``x_(k) >= g_m + Σ_{j<k} p_(j)``;
multiplying by ``p_(k)`` and summing gives the single-machine inequality of
Queyranne (hare.md ref. [33])::

    Σ_{i∈A_m} p_i (x_i - g_m + p_i) >= ½ [P_m² + Σ_{i∈A_m} p_i²]

Summed over m:  ``Σ_{i∈A} p_i x_i >= Σ_m (g_m P_m + ½ P_m²) - ½ Σ_{i∈A} p_i²``.
The middle sum depends on the assignment; its minimum over all ``P_m >= 0``
with ``Σ_m P_m = P(A)`` is a constant of the problem, so using it as the right
side keeps (9') valid for every feasible schedule. That minimum is a water
filling: ``P_m = max(0, λ - g_m)``, and with ``o = min g``, ``h_m = g_m - o``::

    Q(A) = o P + ½ (k λ'² - Σ_{the k lowest h} h²) - ½ Σ_{i∈A} p_i²,
    λ' = (P + Σ_{k lowest} h) / k  for the k active GPUs.

When every GPU is free at ``o`` this is the Cauchy-Schwarz bound
``Σ_m P_m² >= P² / |M_A|`` of the usual form
``Σ p_i (x_i - o + p_i) >= ½ [P² / |M_A| + Σ p_i²]``.

Every feasible schedule of Hare_Sched (with its own x, C) therefore satisfies
every row, so the LP optimum is a lower bound on OPT(Hare_Sched). The paper's
Lemma 2 applies (9) to Algorithm 1's own assignment ``ỹ``, which this
relaxation does not fix; the α(2+α) guarantee of Theorem 4 is therefore not
claimed here, only checked against brute-force optima on small instances
(tests/test_hare_core.py).

Times are shifted by the earliest release so that the LP works with small
numbers, and each (9') row is divided by ``P(A)`` (a weighted mean of start
times), so that the rows stay well scaled at 10^4 tasks. The matrix is built
column-wise from numpy arrays and handed to HiGHS in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import msgspec
import numpy as np
import numpy.typing as npt
from highspy._core import _Highs

from scheduling.ilp import INF, MipOptions
from scheduling.policies.hare.checks import TaskKey, release_s, usable_types, validate_problem
from scheduling.policies.hare.model import TaskJob, TaskProblem

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]


class Relaxed(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The LP's start time x̂_i of every remaining task (absolute seconds) and
    its optimum Σ w_n C_n, a lower bound on Hare_Sched's."""

    starts: dict[TaskKey, float]
    objective: float


@dataclass(frozen=True)
class _Job:
    """One job's block of columns: tasks ``first .. first + R*S - 1`` and
    barriers ``barrier .. barrier + R - 1`` (the last one is C_n)."""

    job: TaskJob
    first: int
    barrier: int
    release: float  # e_i of its tasks (4)
    fastest: float  # T_n^min of (6)/(7)
    p: float  # T^{c,min}, the shortened processing time of (9')
    gpu_ready: Array  # max(job's release, free_s) of each GPU able to run it

    @property
    def tasks(self) -> int:
        return self.job.remaining_rounds * self.job.tasks_per_round


def water_fill(total: float, ready: Array) -> float:
    """``min Σ_m (g_m P_m + ½ P_m²)`` over ``P_m >= 0`` with ``Σ P_m = total``,
    for the GPUs' start times ``ready`` (g_m); see the module docstring."""
    o = float(ready.min())
    h = np.sort(ready - o)
    prefix = np.cumsum(h)
    prefix_sq = np.cumsum(h * h)
    level = (total + prefix) / np.arange(1, h.size + 1)
    # The first k whose level stays at or below the next GPU's start is the
    # number of GPUs that receive work; the level never drops below h_(k).
    active = int(np.argmax(level <= np.append(h[1:], INF)))
    lam = float(level[active])
    return o * total + 0.5 * ((active + 1) * lam * lam - float(prefix_sq[active]))


def queyranne_rhs(p: Array, ready: Array) -> float:
    """Q(A) of (9'): the least ``Σ_{i∈A} p_i x_i`` of any feasible schedule,
    for processing times ``p`` and start times ``ready`` of the GPUs of M_A."""
    return water_fill(float(p.sum()), ready) - 0.5 * float(np.dot(p, p))


def _blocks(problem: TaskProblem) -> list[_Job]:
    free = {t: np.array([g.free_s for g in problem.gpus if g.type == t])
            for t in dict.fromkeys(g.type for g in problem.gpus)}
    jobs = [j for j in problem.jobs if j.remaining_rounds > 0]
    first = 0
    barrier = sum(j.remaining_rounds * j.tasks_per_round for j in jobs)
    blocks: list[_Job] = []
    for job in jobs:
        types = usable_types(problem, job)
        release = release_s(problem, job)
        gpu_free = np.concatenate([free[t] for t in types])
        blocks.append(_Job(
            job=job, first=first, barrier=barrier,
            release=max(release, float(gpu_free.min())),
            fastest=min(job.compute_s[t] + job.sync(t) for t in types),
            p=min(job.compute_s[t] for t in types),
            gpu_ready=np.maximum(gpu_free, release),
        ))
        first += blocks[-1].tasks
        barrier += job.remaining_rounds
    return blocks


class _Coo:
    """Non-zeros and row lower bounds gathered as numpy chunks."""

    def __init__(self) -> None:
        self.rows: list[Index] = []
        self.cols: list[Index] = []
        self.vals: list[Array] = []
        self.lower: list[Array] = []
        self.num_rows = 0

    def add_rows(self, lower: Array) -> int:
        """Declare ``lower.size`` rows ``>= lower``; returns the first index."""
        self.lower.append(lower)
        self.num_rows += lower.size
        return self.num_rows - lower.size

    def add(self, rows: Index, cols: Index, vals: Array) -> None:
        self.rows.append(rows)
        self.cols.append(cols)
        self.vals.append(np.broadcast_to(vals, rows.shape).astype(np.float64))


def _job_rows(coo: _Coo, block: _Job, origin: float) -> None:
    """(6)/(7) through the barriers, and (9') for the job's own tasks."""
    r_n, s_n = block.job.remaining_rounds, block.job.tasks_per_round
    t = np.arange(r_n * s_n, dtype=np.int64)
    x = block.first + t
    own = block.barrier + t // s_n
    # b_{n,r} - x_i >= T_n^min for every task i of round r.
    first = coo.add_rows(np.full(t.size, block.fastest))
    coo.add(first + t, own, np.ones(1))
    coo.add(first + t, x, -np.ones(1))
    # x_j - b_{n,r} >= 0 for every task j of round r + 1.
    later = t[s_n:]
    first = coo.add_rows(np.zeros(later.size))
    coo.add(first + later - s_n, x[s_n:], np.ones(1))
    coo.add(first + later - s_n, own[s_n:] - 1, -np.ones(1))
    p = np.full(t.size, block.p)
    row = coo.add_rows(np.array([queyranne_rhs(p, block.gpu_ready) / p.sum() - origin]))
    coo.add(np.full(t.size, row), x, np.array([1.0 / t.size]))


def _all_row(coo: _Coo, problem: TaskProblem, blocks: list[_Job], origin: float) -> None:
    """(9') for all tasks together, on every GPU that can run one of them."""
    p = np.concatenate([np.full(b.tasks, b.p) for b in blocks])
    able = {t for b in blocks for t in usable_types(problem, b.job)}
    release = min(release_s(problem, b.job) for b in blocks)
    ready = np.array([max(g.free_s, release) for g in problem.gpus if g.type in able])
    row = coo.add_rows(np.array([queyranne_rhs(p, ready) / p.sum() - origin]))
    coo.add(np.full(p.size, row), np.arange(p.size, dtype=np.int64), p / p.sum())


def _lp(problem: TaskProblem, blocks: list[_Job], origin: float) -> highspy.HighsLp:
    """The LP of the module docstring, times shifted by ``origin``, in
    column-wise form."""
    n_tasks = sum(b.tasks for b in blocks)
    n_cols = n_tasks + sum(b.job.remaining_rounds for b in blocks)
    coo = _Coo()
    for block in blocks:
        _job_rows(coo, block, origin)
    _all_row(coo, problem, blocks, origin)
    rows, cols = np.concatenate(coo.rows), np.concatenate(coo.cols)
    order = np.lexsort((rows, cols))
    start = np.zeros(n_cols + 1, dtype=np.int64)
    start[1:] = np.cumsum(np.bincount(cols, minlength=n_cols))
    cost, lower = np.zeros(n_cols), np.zeros(n_cols)
    for block in blocks:
        lower[block.first:block.first + block.tasks] = block.release - origin
        cost[block.barrier + block.job.remaining_rounds - 1] = block.job.weight
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, coo.num_rows
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, lower, np.full(n_cols, INF)
    lp.row_lower_ = np.concatenate(coo.lower)
    lp.row_upper_ = np.full(coo.num_rows, INF)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_cols, coo.num_rows
    lp.a_matrix_.start_ = start.astype(np.int32)
    lp.a_matrix_.index_ = rows[order].astype(np.int32)
    lp.a_matrix_.value_ = np.concatenate(coo.vals)[order]
    lp.sense_ = highspy.ObjSense.kMinimize
    return lp


def _solve(lp: highspy.HighsLp) -> Array:
    # The bare binding, as scheduling.ilp does: no banner on stdout. The
    # thread count is the project's (HiGHS keeps the first one a process uses).
    h = _Highs()
    options: dict[str, bool | int | str] = {
        "output_flag": False, "threads": MipOptions().threads, "random_seed": 0,
    }
    for name, value in options.items():
        if h.setOptionValue(name, value) != highspy.HighsStatus.kOk:
            raise ValueError(f"HiGHS rejected option {name}={value!r}")
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        raise ValueError("HiGHS rejected the relaxation")
    h.run()
    status = h.getModelStatus()
    # The LP is always feasible (late enough starts) and bounded (C_n >= its
    # release), so anything but an optimum is a numerical failure.
    if status != highspy.HighsModelStatus.kOptimal:
        raise ValueError(f"HiGHS did not solve the relaxation: {h.modelStatusToString(status)}")
    return np.asarray(h.getSolution().col_value, dtype=np.float64)


def relax(problem: TaskProblem) -> Relaxed:
    """Solve the LP of the module docstring: x̂_i of every remaining task and
    the optimum, a lower bound on Σ w_n C_n of every feasible schedule."""
    validate_problem(problem)
    blocks = _blocks(problem)
    if not blocks:
        return Relaxed({}, 0.0)
    origin = min(release_s(problem, b.job) for b in blocks)
    values = _solve(_lp(problem, blocks, origin))
    starts: dict[TaskKey, float] = {}
    objective = 0.0
    for block in blocks:
        job = block.job
        xs = (values[block.first:block.first + block.tasks] + origin).tolist()
        keys = ((job.id, r, k) for r in range(job.done_rounds, job.rounds)
                for k in range(job.tasks_per_round))
        starts.update(zip(keys, xs, strict=True))
        objective += job.weight * (float(values[block.barrier + job.remaining_rounds - 1]) + origin)
    return Relaxed(starts, objective)
