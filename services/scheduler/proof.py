"""How long a pass searches (see :mod:`services.scheduler.passes`): the
restricted model that finds a large pass an incumbent, and the proof budget
of branch and bound once the incumbent is close to the LP bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from services.scheduler.formulation import Assignment, OptionSpace
from services.scheduler.ilp import MipModel, MipOptions, solve_mip
from services.scheduler.warmstart import current_option

if TYPE_CHECKING:
    from services.scheduler.passes import PassJob, SolverSettings

# Passes with more options than this first solve a restricted model for an
# incumbent (see restricted_incumbent), keeping each job's best few options
# besides the LP's support.
RESTRICT_MIN_OPTIONS = 500
RESTRICT_TOP_OPTIONS = 6


def mip_time_limit(start: float, bound: float, left: float, settings: SolverSettings) -> float:
    """Branch and bound's time limit for a start of objective ``start``.

    Where the start is within ``accept_gap`` of the LP bound, B&B gets at most
    ``proof_time_s``. On loaded passes of the direct model the start from the
    warm start and the restricted model is already the MIP's answer: re-solved
    for 100 s, the heaviest passes of the ElasticFlow trace (1,300-3,000
    columns) ended within 0.2% of the start, while the LP bound sits 1.5-2%
    above it and HiGHS spends its whole 10 s limit proving the 1% gap
    (docs/performance.md). The default accept_gap, 5%, is the gap the paper
    ran Gurobi with (§4.7); the pass still reports the gap it proved.
    """
    if proven(start, bound, settings.accept_gap):
        return min(left, settings.proof_time_s)
    return left


def proven(value: float, bound: float, gap: float) -> bool:
    """``value`` is within the relative ``gap`` of ``bound``."""
    return value > 0 and bound - value <= gap * value


def restricted_incumbent(
    space: OptionSpace,
    jobs: Sequence[PassJob],
    model: MipModel,
    options: MipOptions,
    relaxed: npt.NDArray[np.float64],
    start: Assignment,
    incumbent: list[float],
) -> tuple[list[float], float]:
    """A better incumbent from the MIP over a few columns per job: the LP
    relaxation's support, the warm start, the jobs' current options and their
    best few. The root LP bound is tight here while the heuristic starts are
    not, so HiGHS searches the full model long unless it gets an incumbent
    within the gap; the restricted model is small and solves quickly, and its
    solution is feasible in the full model (same columns, the rest at 0)."""
    allowed = set(np.flatnonzero(relaxed[: len(space.options)] > 1e-6).tolist())
    allowed.update(o for o, _ in start.values())
    for i, job in enumerate(jobs):
        allowed.update(space.per_job[i][:RESTRICT_TOP_OPTIONS])
        if job.current is not None and (o := current_option(space, i, job.current)) is not None:
            allowed.add(o)
    barred = np.setdiff1d(np.arange(len(space.options)), np.fromiter(allowed, np.int64))
    sub = model.fixed_to_zero(barred)
    sub_options = msgspec.structs.replace(
        options,
        mip_rel_gap=options.mip_rel_gap / 4,
        time_limit_s=options.time_limit_s / 10,
        presolve=True,
    )
    sol = solve_mip(sub, sub_options, incumbent=incumbent)
    better = sol.has_solution and sol.objective > sub.objective(incumbent)
    return ([float(v) for v in sol.values] if better else incumbent), sol.solve_s
