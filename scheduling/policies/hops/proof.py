"""How far a pass searches (see :mod:`scheduling.policies.hops.passes`): the
restricted model that finds a large pass an incumbent, and when an
incumbent settles the pass without branch and bound. Both end on counts,
not on the clock, so a pass gives the same plan on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from scheduling.ilp import MipModel, MipOptions, solve_mip
from scheduling.policies.hops.formulation import Assignment, OptionSpace
from scheduling.policies.hops.warmstart import current_option

if TYPE_CHECKING:
    from scheduling.policies.hops.passtypes import PassJob, SolverSettings

# Passes with more options than this first solve a restricted model for an
# incumbent (see restricted_incumbent), keeping each job's best few options
# besides the LP's support.
RESTRICT_MIN_OPTIONS = 500
RESTRICT_TOP_OPTIONS = 6


def settled(start: float, bound: float, settings: SolverSettings, *, large: bool) -> str | None:
    """The status of a pass that a start of objective ``start`` settles
    without branch and bound, or None when B&B has to run.

    Within ``mip_rel_gap`` of the LP bound HiGHS would stop at its root with
    the start ("Optimal"). A ``large`` pass (one whose start the restricted
    model has searched) is also settled within ``accept_gap`` ("Accepted"):
    5% is the gap the paper ran Gurobi with (§4.7), and on the loaded passes
    of the ElasticFlow trace (direct models of 1,100-3,000 columns) that
    start was already the answer: re-solved for 100 s they ended within 0.2%
    of it, while the LP bound sits 1.5-2% above and HiGHS spends its whole
    time limit proving a weak bound (docs/performance.md). Accepting, rather
    than capping B&B by time, keeps the plan independent of the machine's
    speed, so a simulation is repeatable. Small passes still search to
    ``mip_rel_gap``, which takes HiGHS a fraction of a second there. The pass
    reports the gap to the LP bound.
    """
    if proven(start, bound, settings.mip_rel_gap):
        return "Optimal"
    if large and proven(start, bound, settings.accept_gap):
        return "Accepted"
    return None


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
    nodes: int,
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
    # A node limit, not a time limit, ends the search: the same incumbent on
    # any machine. The pass's time limit stays as a safety net.
    sub_options = msgspec.structs.replace(
        options, mip_rel_gap=options.mip_rel_gap / 4, presolve=True, max_nodes=nodes
    )
    sol = solve_mip(sub, sub_options, incumbent=incumbent)
    better = sol.has_solution and sol.objective > sub.objective(incumbent)
    return ([float(v) for v in sol.values] if better else incumbent), sol.solve_s
