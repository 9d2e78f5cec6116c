"""Macro-tasks: a real job has 10^4-10^6 rounds, far more tasks than the
relaxation (:mod:`.relax`) and the greedy (:mod:`.greedy`) should see one by
one, so consecutive rounds are grouped.

Rule
----
With ``S_n`` the job's tasks per round (its sync scale |D_r|) and ``R_n`` its
remaining rounds, every job gets at most

    Q = max(1, budget // Σ_n S_n)

macro-rounds, ``K_n = ceil(R_n / Q)`` real rounds per macro-round at most,
and ``M_n = ceil(R_n / K_n) <= Q`` macro-rounds. Macro-round ``q`` covers the
real rounds ``floor(q R_n / M_n) .. floor((q + 1) R_n / M_n) - 1`` after the
done ones: ``floor(R_n / M_n)`` or ``ceil(R_n / M_n) <= K_n`` of them, so the
rounds are spread evenly and no macro-round is a short remainder. A
macro-task is one task slot (one of the S_n tasks) for a macro-round's
rounds; the macro job gives it the mean of those round counts,
``scale_n = R_n / M_n`` (``= K_n`` whenever ``K_n`` divides ``R_n``), as
compute ``scale_n · T^c`` and sync ``scale_n · T^s``: every real round still
synchronises. Hence

* the macro problem has ``Σ_n M_n S_n <= Q Σ_n S_n <= budget`` tasks (when
  ``Σ_n S_n`` alone exceeds the budget, every job gets one macro-round and
  the count is ``Σ_n S_n``);
* each job's GPU time is exact: ``M_n S_n scale_n T^c = R_n S_n T^c`` on any
  one type; a single macro-round is off from its real rounds by less than
  one round's ``T^c + T^s`` (it uses the mean count), and these errors cancel
  over the job;
* ``K_n = 1`` and ``scale_n = 1`` when every job fits: the problem is
  unchanged.

What the coarser barrier changes
--------------------------------
The macro job synchronises only between macro-rounds (7). Within one, the
macro-tasks of different slots may run at different times on different GPUs,
so one slot may be up to K_n real rounds ahead of another: the plan is exact
for a job trained with bounded staleness K_n - 1 (a slot may run up to
K_n - 1 rounds ahead of the slowest). A real per-round barrier keeps the slots
in lockstep instead; executing the macro plan that way takes the same GPU
time but may stretch a macro-round when its macro-tasks do not start
together.
"""

from __future__ import annotations

import math

import msgspec

from scheduling.policies.hare.model import TaskJob, TaskProblem

DEFAULT_BUDGET = 10_000


class MacroJob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A real job's macro job (same id, arrival, weight; rounds are
    macro-rounds, none done) with ``k`` (K_n), ``scale`` (real rounds per
    macro-task on average) and where its rounds start (``first_round``)."""

    job: TaskJob
    k: int
    scale: float
    first_round: int
    real_rounds: int  # R_n, the real job's remaining rounds

    def real_rounds_of(self, macro_round: int) -> range:
        """The real rounds that macro-round ``macro_round`` stands for."""
        m = self.job.remaining_rounds
        if not 0 <= macro_round < m:
            raise ValueError(f"macro job {self.job.id}: no macro-round {macro_round}")
        lo = macro_round * self.real_rounds // m
        hi = (macro_round + 1) * self.real_rounds // m
        return range(self.first_round + lo, self.first_round + hi)


def rounds_per_macro(jobs: tuple[TaskJob, ...], budget: int = DEFAULT_BUDGET) -> int:
    """Q of the module docstring: the most macro-rounds any job gets."""
    if budget < 1:
        raise ValueError("budget must be >= 1")
    slots = sum(j.tasks_per_round for j in jobs if j.remaining_rounds > 0)
    return max(1, budget // slots) if slots else 1


def _macro(job: TaskJob, q: int) -> MacroJob:
    left = job.remaining_rounds
    if left == 0:
        # Nothing to plan; a one-round job with that round done says so.
        return MacroJob(msgspec.structs.replace(job, rounds=1, done_rounds=1), 1, 1.0,
                        job.done_rounds, 0)
    k = math.ceil(left / q)
    m = math.ceil(left / k)
    scale = 1.0 if m == left else left / m
    macro = msgspec.structs.replace(
        job,
        rounds=m,
        done_rounds=0,
        compute_s={t: scale * c for t, c in job.compute_s.items()},
        sync_s={t: scale * s for t, s in job.sync_s.items()},
    )
    return MacroJob(macro, k, scale, job.done_rounds, left)


def group(jobs: tuple[TaskJob, ...], budget: int = DEFAULT_BUDGET) -> tuple[MacroJob, ...]:
    """Each job's macro job, in the order of ``jobs`` (the rule of the
    module docstring)."""
    q = rounds_per_macro(jobs, budget)
    return tuple(_macro(job, q) for job in jobs)


def macro_problem(
    problem: TaskProblem, budget: int = DEFAULT_BUDGET
) -> tuple[TaskProblem, tuple[MacroJob, ...]]:
    """``problem`` with its jobs replaced by their macro jobs (same GPUs,
    ``now`` and ``ready_s``), and the macro jobs."""
    macros = group(problem.jobs, budget)
    grouped = msgspec.structs.replace(problem, jobs=tuple(m.job for m in macros))
    return grouped, macros
