"""One planning pass: the prior-weighted ILP of Hops §3.6 (Eq. 11-13).

The caller hands over the jobs allowed into the pass (service window plus the
sensitivity adjustment) with their weights ``(prior + bias)^lambda`` and the
idle GPUs per server. :func:`solve_pass` maximises Eq. (11),
``sum_ij w_i * G_ij * x_ij``, where G is the throughput gain matrix (Table 1:
each option's throughput over the job's smallest one in this pass), subject to
at most one configuration per job (12) and the servers' idle GPUs (13).

Two formulations of the same objective (built in :mod:`scheduling.policies.hops.formulation`):

* ``direct``: one binary per (job, location-specific configuration) from
  :func:`~scheduling.policies.hops.candidates.generate_configs`; the paper's literal
  model, used while it has at most ``direct_max_columns`` columns.
* ``class``: servers interchangeable for every job (same type, same idle GPUs,
  same curves) form a class; a job picks "R_k on one server of class c"
  (aggregated) or "R_k over ceil(R_k / S) servers of class c" (distributed:
  whole servers plus one tail), and each class is packed exactly by integer
  pattern counts (Gilmore–Gomory). The solution is then realised on concrete
  servers, each distributed configuration on consecutive servers of its
  class. This mode restricts a distributed configuration to one class,
  whereas the direct mode follows the paper's adjacency over all idle servers
  of the type; where each type is one class both give the same optimum.
  Within a class an option is dropped when a smaller one of the same job has
  at least its throughput, which leaves the optimum unchanged.

Weights are scaled so the largest is 1 and floored at ``WEIGHT_FLOOR``: with a
large lambda relative weights underflow, and a zero coefficient would hide a
job from the solver. As the floor lies far below the gap tolerance the solver
may still leave such jobs out, so after the solve the jobs without a
configuration take what is left, greedily in the caller's (descending
priority) order, which can only raise Eq. (11). ``objective`` and ``bound`` are
reported in these scaled weights; ``bound`` is ``inf`` when the solver stopped
before proving one. :func:`greedy_pass` is the lambda -> infinity limit.

HiGHS gets a warm start, the best of: the greedy pass, the rounded LP
relaxation and the jobs' current configurations (each completed with what is
left), improved by a local search. When the current configurations give
every job one of its best options, that plan is the optimum and nothing is
solved. The LP relaxation's bound is usually within a fraction of a
percent of the optimum, so the pass is settled by a good incumbent: a large
pass whose start is not within a quarter of the gap of that bound first
solves a model restricted to a few columns per job (its search ends at a
node limit). When the incumbent is within ``mip_rel_gap`` of the LP bound,
or for such a large pass within ``accept_gap``, the full MIP is not run at
all (see :func:`~scheduling.policies.hops.proof.settled`); ``bound`` is then the
LP bound. No step of a pass ends on the clock unless the safety time limit
is reached, so a pass gives the same plan on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from scheduling.ilp import MipModel, MipOptions, solve_mip, solve_relaxation
from scheduling.policies.hops.formulation import (
    Assignment,
    OptionSpace,
    PassOption,
    build_model,
    decode,
    incumbent_values,
    option_space,
)
from scheduling.policies.hops.passtypes import (
    DIRECT_MAX_COLUMNS,
    Choice,
    PassJob,
    PassResult,
    SolverSettings,
)
from scheduling.policies.hops.planstate import PlanState
from scheduling.policies.hops.proof import (
    RESTRICT_MIN_OPTIONS,
    proven,
    restricted_incumbent,
    settled,
)
from scheduling.policies.hops.warmstart import (
    current_option,
    everyone_at_best,
    fill_leftovers,
    greedy_assign,
    warm_start,
)
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import ServerId

WEIGHT_FLOOR = 1e-9

__all__ = [
    "DIRECT_MAX_COLUMNS", "WEIGHT_FLOOR", "Choice", "PassJob", "PassResult", "SolverSettings",
    "greedy_pass", "scaled_weights", "solve_pass",
]


def scaled_weights(jobs: Sequence[PassJob]) -> list[float]:
    """Eq. (11) weights over the largest one, floored (see the module doc)."""
    for job in jobs:
        if not (job.weight >= 0 and math.isfinite(job.weight)):
            raise ValueError(f"job {job.job_id}: weight must be finite and >= 0")
    top = max((job.weight for job in jobs), default=0.0)
    if top <= 0:
        return [1.0] * len(jobs)
    return [max(job.weight / top, WEIGHT_FLOOR) for job in jobs]


def _result(
    space: OptionSpace,
    jobs: Sequence[PassJob],
    coeffs: Sequence[float],
    assignment: Assignment,
    *,
    bound: float,
    solve_s: float,
    status: str,
    formulation: str,
    columns: int,
) -> PassResult:
    choices = tuple(
        Choice(jobs[i].job_id, config, space.options[o].throughput, space.options[o].gain)
        for i, (o, config) in sorted(assignment.items())
    )
    objective = sum(coeffs[o] for o, _ in assignment.values())
    bound = math.inf if math.isnan(bound) else max(bound, objective)
    gap = (bound - objective) / objective if objective > 0 else 0.0
    return PassResult(choices, objective, bound, gap, solve_s, status, formulation, columns)


def _empty() -> PassResult:
    return PassResult((), 0.0, 0.0, 0.0, 0.0, "empty", "empty", 0)


def _space(
    cluster: Cluster,
    free: Mapping[ServerId, int],
    jobs: Sequence[PassJob],
    settings: SolverSettings,
) -> OptionSpace:
    return option_space(
        cluster,
        free,
        jobs,
        sigma=settings.sigma,
        direct_max_columns=settings.direct_max_columns,
        max_patterns=settings.max_patterns,
    )


def _gain(option: PassOption, job: PassJob, per_gpu: bool) -> float:
    """G_ij of Eq. (11); with ``per_gpu`` its speed-up over the job's
    slowest option counted once per GPU of the job's smallest request R_1
    (``1 + (G_ij - 1) * R_1``): the same order among the job's own options,
    but across jobs a speed-up weighs by the GPUs it makes faster
    (``HopsSettings.gain_per_gpu``)."""
    scale = job.requirements[0] if per_gpu and job.requirements else 1
    return option.gain if scale == 1 else 1.0 + (option.gain - 1.0) * scale


def _coefficients(
    space: OptionSpace, jobs: Sequence[PassJob], weights: Sequence[float],
    settings: SolverSettings | None = None,
) -> list[float]:
    """w_i * G_ij of Eq. (11), with the switch factor on every option that
    would restart the job (all options of a job that does not run), plus
    the job's keep bonus, rescaled as the weights are, on the option that
    keeps it where it runs; then the moves below ``move_min_gain`` damped."""
    settings = settings or SolverSettings()
    per_gpu, floor = settings.gain_per_gpu, settings.move_min_gain
    coeffs = [weights[o.job] * _gain(o, jobs[o.job], per_gpu) for o in space.options]
    top = max((job.weight for job in jobs), default=0.0)
    for i, job in enumerate(jobs):
        damp = floor > 0 and job.current is not None
        if job.switch_factor == 1.0 and not job.keep_bonus and not damp:
            continue
        keep = current_option(space, i, job.current) if job.current is not None else None
        stay = coeffs[keep] if keep is not None else 0.0
        bonus = job.keep_bonus / top if top > 0 else 0.0
        for o in space.per_job[i]:
            if o != keep:
                coeffs[o] *= job.switch_factor
            else:
                coeffs[o] += bonus
        if damp and keep is not None:
            _damp_moves(space, coeffs, i, keep, stay, floor)
    return coeffs


def _damp_moves(
    space: OptionSpace, coeffs: list[float], i: int, keep: int, stay: float, floor: float
) -> None:
    """``HopsSettings.move_min_gain``: an option of running job i with its
    current GPU count elsewhere, estimated less than ``1 + floor`` times as
    fast as where it runs, weighs at most ``1 - floor`` of staying: the job
    moves for its own sake only for a gain of ``floor``, and for others'
    only when its GPUs are worth that much more to them."""
    here = space.options[keep]
    for o in space.per_job[i]:
        opt = space.options[o]
        if o != keep and opt.gpus == here.gpus and opt.throughput < here.throughput * (1 + floor):
            coeffs[o] = min(coeffs[o], stay) * (1.0 - floor)


def _check(jobs: Sequence[PassJob]) -> list[float]:
    ids = [job.job_id for job in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("jobs: duplicate job id")
    return scaled_weights(jobs)


def _incumbent(
    space: OptionSpace,
    model: MipModel,
    options: MipOptions,
    jobs: Sequence[PassJob],
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
    settings: SolverSettings,
    hints: Sequence[Mapping[int, Configuration]],
) -> tuple[list[float], float, float]:
    """The pass's best start before the MIP, the LP bound and the time spent."""
    relaxed, lp_s = solve_relaxation(model, options)
    # The LP relaxation's optimum bounds Eq. (11) from above; a start within a
    # quarter of the gap of it needs no further search.
    bound = model.objective(relaxed.tolist()) if relaxed is not None else math.inf
    gap = settings.mip_rel_gap
    start, state = warm_start(
        space, coeffs, free, len(jobs), relaxed, hints, enough=bound / (1 + gap / 4)
    )
    incumbent = incumbent_values(space, start, state.items, model.num_cols)
    large = len(space.options) > RESTRICT_MIN_OPTIONS
    if relaxed is not None and large and not proven(model.objective(incumbent), bound, gap / 4):
        incumbent, sub_s = restricted_incumbent(
            space, jobs, model, options, relaxed, start, incumbent, settings.restrict_nodes
        )
        lp_s += sub_s
    return incumbent, bound, lp_s


def _solve(
    space: OptionSpace,
    jobs: Sequence[PassJob],
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
    settings: SolverSettings,
    hints: Sequence[Mapping[int, Configuration]],
) -> PassResult:
    model = build_model(space, coeffs, free)
    # Presolve finds nothing to reduce in the direct model, and its symmetric
    # columns make it slow there.
    options = MipOptions(
        settings.mip_rel_gap,
        settings.time_limit_s,
        settings.threads,
        settings.random_seed,
        presolve=space.formulation != "direct",
    )
    incumbent, bound, lp_s = _incumbent(space, model, options, jobs, coeffs, free, settings,
                                        hints)
    large = len(space.options) > RESTRICT_MIN_OPTIONS
    status = settled(model.objective(incumbent), bound, settings, large=large)
    if status is not None:
        values = np.asarray(incumbent, dtype=np.float64)
    else:
        sol = solve_mip(model, options, incumbent=incumbent)
        values, bound, status = sol.values, sol.bound, sol.status
        lp_s += sol.solve_s
        if not sol.has_solution:
            values = np.asarray(incumbent, dtype=np.float64)
    current = {i: j.current for i, j in enumerate(jobs) if j.current is not None}
    chosen = decode(space, values, current, pin=settings.keep_in_place_partial)
    assignment = fill_leftovers(space, free, len(jobs), chosen)
    return _result(space, jobs, coeffs, assignment, bound=bound, solve_s=lp_s, status=status,
                   formulation=space.formulation, columns=model.num_cols)


def solve_pass(
    cluster: Cluster,
    free: Mapping[ServerId, int],
    jobs: Sequence[PassJob],
    settings: SolverSettings | None = None,
) -> PassResult:
    """Maximise Eq. (11) subject to (12) and (13) over the pass's jobs."""
    settings = settings or SolverSettings()
    if settings.greedy:
        return greedy_pass(cluster, free, jobs, settings)
    weights = _check(jobs)
    space = _space(cluster, free, jobs, settings)
    if not space.options:
        return _empty()
    coeffs = _coefficients(space, jobs, weights, settings)
    current = {i: j.current for i, j in enumerate(jobs) if j.current is not None}
    # Where the running jobs keep their places and every other job still gets
    # one of its best options, that plan is the optimum: most rounds of a
    # lightly loaded cluster end here without a solve.
    if (best := everyone_at_best(space, coeffs, free, current)) is not None:
        objective = sum(coeffs[o] for o, _ in best.values())
        return _result(space, jobs, coeffs, best, bound=objective, solve_s=0.0,
                       status="Optimal", formulation=space.formulation,
                       columns=len(space.options))
    return _solve(space, jobs, coeffs, free, settings, (current,))


def greedy_pass(
    cluster: Cluster,
    free: Mapping[ServerId, int],
    jobs: Sequence[PassJob],
    settings: SolverSettings | None = None,
) -> PassResult:
    """The lambda -> infinity limit of Eq. (11): jobs in the given (descending
    priority) order each take their feasible option with the largest G (then
    fewer GPUs, then cluster order); jobs that fit nowhere are skipped. The
    options are those :func:`solve_pass` would use; no bound is proven, so
    ``bound`` equals the objective."""
    settings = settings or SolverSettings()
    weights = _check(jobs)
    space = _space(cluster, free, jobs, settings)
    if not space.options:
        return _empty()
    coeffs = [weights[o.job] * o.gain for o in space.options]
    assignment = greedy_assign(space, PlanState(space, free), len(jobs), {})
    return _result(
        space,
        jobs,
        coeffs,
        assignment,
        bound=0.0,
        solve_s=0.0,
        status="greedy",
        formulation="greedy",
        columns=len(space.options),
    )
