"""Starting points and completions for a pass's MIP (see
:mod:`scheduling.policies.hops.passes`): the greedy order, the rounded LP
relaxation, hints (the jobs' current configurations), a
local search on the best of them (:mod:`scheduling.policies.hops.localsearch`), and
filling what a solution leaves idle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from scheduling.policies.hops.formulation import Assignment, OptionSpace
from scheduling.policies.hops.localsearch import improve
from scheduling.policies.hops.planstate import PlanState, plan_value
from shared.configuration import Configuration
from shared.ids import ServerId


def greedy_assign(
    space: OptionSpace, state: PlanState, n_jobs: int, chosen: Assignment
) -> Assignment:
    """Jobs in the given order each take their best option that still fits."""
    for i in range(n_jobs):
        if i in chosen:
            continue
        for o in space.per_job[i]:
            config = state.place(space.options[o])
            if config is not None:
                state.take(config)
                chosen[i] = (o, config)
                break
    return chosen


def current_option(space: OptionSpace, i: int, current: Configuration) -> int | None:
    """The option of job i that its current configuration is an instance of."""
    shape: list[int] | None = None
    for o in space.per_job[i]:
        opt = space.options[o]
        if opt.config is not None:
            if opt.config == current:
                return o
        elif opt.klass is not None and opt.gpus == current.total_gpus:
            c = opt.klass.klass
            klass = space.classes[c]
            same_class = all(space.klass_of.get(s) == c for s in current.servers)
            if shape is None:
                shape = sorted((g for _, g in current.parts), reverse=True)
            if same_class and shape == [g for g, _ in opt.klass.items(klass.free)]:
                return o
    return None


def _shapes(
    space: OptionSpace, x: Sequence[float] | npt.NDArray[np.float64], coeffs: Sequence[float]
) -> list[list[list[int]]]:
    """Per job with LP mass, its option shapes (job, gain, GPUs), which are
    interchangeable for the objective, each listing its options by LP value.
    Shapes go by LP mass, then coefficient; jobs the LP takes whole come first
    (larger first: first-fit decreasing), split jobs after them."""
    n = len(space.options)
    # Only jobs with a non-zero column can have a shape with LP mass; the
    # LP leaves most jobs' columns at exactly zero.
    massive = {space.options[o].job for o in np.flatnonzero(np.asarray(x)[:n]).tolist()}
    groups: dict[tuple[int, float, int], list[int]] = {}
    for job in massive:
        for o in sorted(space.per_job[job]):
            opt = space.options[o]
            groups.setdefault((job, opt.gain, opt.gpus), []).append(o)
    values = np.asarray(x).tolist()
    per_job: dict[int, list[tuple[float, list[int]]]] = {}
    for (job, _, _), members in groups.items():
        total = 0.0
        for o in members:
            total += values[o]
        # numpy's rounding, as the sum of the LP's float64 values had.
        weight = float(round(np.float64(total), 6))
        if weight > 1e-6:
            members.sort(key=lambda o: -values[o])
            per_job.setdefault(job, []).append((weight, members))
    for shapes in per_job.values():
        shapes.sort(key=lambda t: (-t[0], -coeffs[t[1][0]], t[1][0]))
    order = sorted(
        per_job, key=lambda j: (-per_job[j][0][0], -space.options[per_job[j][0][1][0]].gpus, j)
    )
    return [[members for _, members in per_job[j]] for j in order]


def _lp_rounding(
    space: OptionSpace,
    x: Sequence[float] | npt.NDArray[np.float64],
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
    ranked: Sequence[int] | None = None,
) -> tuple[Assignment, PlanState]:
    """Round the LP relaxation (see :func:`_shapes`) onto any servers that fit,
    then let the jobs left take what remains by objective per GPU."""
    state = PlanState(space, free)
    chosen: Assignment = {}
    # Columns the LP takes whole go first: a job the LP keeps on its current
    # option (the switch factor favours exactly that column) keeps it, before
    # a job split over interchangeable columns lands there by first fit.
    taken = np.flatnonzero(np.asarray(x)[: len(space.options)] > 1 - 1e-6).tolist()
    whole = sorted(taken, key=lambda o: (-space.options[o].gpus, o))
    for o in whole:
        opt = space.options[o]
        if opt.job not in chosen and (config := state.place(opt)) is not None:
            state.take(config)
            chosen[opt.job] = (o, config)
    for shapes in _shapes(space, x, coeffs):
        if space.options[shapes[0][0]].job in chosen:
            continue
        for o in (o for members in shapes for o in members):
            config = state.place(space.options[o])
            if config is not None:
                state.take(config)
                chosen[space.options[o].job] = (o, config)
                break
    return _top_up(space, coeffs, state, chosen, ranked), state


def by_ratio(space: OptionSpace, coeffs: Sequence[float]) -> list[int]:
    """All options, best objective per GPU first (then by index)."""
    gpus = np.fromiter((o.gpus for o in space.options), np.float64, len(space.options))
    ratio = -np.asarray(coeffs, dtype=np.float64)[: gpus.size] / gpus
    # A stable sort breaks ties by index.
    order: list[int] = np.argsort(ratio, kind="stable").tolist()
    return order


def _top_up(
    space: OptionSpace,
    coeffs: Sequence[float],
    state: PlanState,
    chosen: Assignment,
    ranked: Sequence[int] | None = None,
) -> Assignment:
    """Complete a warm start: jobs without a configuration take what is left,
    best objective per GPU first (what is left is scarce). ``ranked`` is
    :func:`by_ratio`, which starts of one pass share."""
    ranked = by_ratio(space, coeffs) if ranked is None else ranked
    rest = [o for o in ranked if space.options[o].job not in chosen]
    for o in rest:
        opt = space.options[o]
        if opt.job not in chosen and (config := state.place(opt)) is not None:
            state.take(config)
            chosen[opt.job] = (o, config)
    return chosen


def _from_hint(
    space: OptionSpace,
    coeffs: Sequence[float],
    hint: Mapping[int, Configuration],
    free: Mapping[ServerId, int],
    ranked: Sequence[int] | None = None,
) -> tuple[Assignment, PlanState]:
    """Keep the hinted configurations that are options here and still fit;
    a hinted job whose configuration is not (a running job whose servers
    changed class, say) takes its best option of the same size that fits.
    Then top up."""
    state = PlanState(space, free)
    chosen: Assignment = {}
    missed = []
    for i, config in sorted(hint.items()):
        o = current_option(space, i, config)
        if o is not None and state.fits(config):
            state.take(config)
            chosen[i] = (o, config)
        else:
            missed.append((i, config.total_gpus))
    for i, gpus in missed:
        for o in (o for o in space.per_job[i] if space.options[o].gpus == gpus):
            if (placed := state.place(space.options[o])) is not None:
                state.take(placed)
                chosen[i] = (o, placed)
                break
    return _top_up(space, coeffs, state, chosen, ranked), state


def everyone_at_best(
    space: OptionSpace,
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
    hint: Mapping[int, Configuration],
) -> Assignment | None:
    """The hinted plan (topped up) when it gives every job one of its best
    options: then no plan does better, as Eq. (11) is a sum over jobs of one
    coefficient each, and no solve is needed. None otherwise."""
    if not hint:
        return None
    best = [max((coeffs[o] for o in options), default=0.0) for options in space.per_job]
    for i, config in hint.items():  # cheap test first: a running job not at its best
        o = current_option(space, i, config)
        if o is None or coeffs[o] < best[i]:
            return None
    chosen, _ = _from_hint(space, coeffs, hint, free)
    for i, options in enumerate(space.per_job):
        held = chosen.get(i)
        if options and (held is None or coeffs[held[0]] < best[i]):
            return None
    return chosen


def warm_start(
    space: OptionSpace,
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
    n_jobs: int,
    relaxed: Sequence[float] | npt.NDArray[np.float64] | None,
    hints: Sequence[Mapping[int, Configuration]],
    enough: float = math.inf,
) -> tuple[Assignment, PlanState]:
    """The best of: each hint (the jobs' current configurations), the
    rounded LP relaxation, and the greedy pass, improved by
    local search (:func:`improve`) until it is worth ``enough``."""
    ranked = by_ratio(space, coeffs)
    starts = [_from_hint(space, coeffs, hint, free, ranked) for hint in hints if hint]
    if relaxed is not None:
        starts.append(_lp_rounding(space, relaxed, coeffs, free, ranked))
    state = PlanState(space, free)
    starts.append((greedy_assign(space, state, n_jobs, {}), state))
    chosen, state = max(starts, key=lambda s: plan_value(s[0], coeffs))
    return improve(space, coeffs, state, chosen, enough), state


def fill_leftovers(
    space: OptionSpace, free: Mapping[ServerId, int], n_jobs: int, assignment: Assignment
) -> Assignment:
    """Apply a solution, then let the jobs left without one take what is left."""
    state = PlanState(space, free)
    for _, config in assignment.values():
        state.take(config)
    return greedy_assign(space, state, n_jobs, dict(assignment))
