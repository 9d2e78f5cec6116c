"""Starting points and completions for a pass's MIP (see
:mod:`services.scheduler.passes`): the greedy order, the rounded LP
relaxation, hints (current configurations, the class formulation's plan), and
filling what a solution leaves idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from services.scheduler.candidates import ClassOption, Item, ServerClass
from services.scheduler.formulation import Assignment, OptionSpace, PassOption
from shared.configuration import Configuration
from shared.ids import ServerId


def _first_run(servers: Sequence[ServerId], whole: set[ServerId], n: int) -> list[ServerId]:
    """The first n consecutive servers of the class that are wholly idle."""
    run: list[ServerId] = []
    for sid in servers:
        run = [*run, sid] if sid in whole else []
        if len(run) == n:
            return run
    return []


class PlanState:
    """Idle GPUs per server while a plan is assembled, plus the items each
    server holds (the class formulation recovers pattern counts from them)."""

    def __init__(self, space: OptionSpace, free: Mapping[ServerId, int]) -> None:
        self.space = space
        self.free = {sid: g for sid, g in free.items() if g > 0}
        self.items: dict[ServerId, list[Item]] = {}

    def _items(self, config: Configuration) -> list[tuple[ServerId, Item]]:
        # In a class, a distributed configuration's part below the class's
        # idle GPUs is its tail; direct mode keeps no items.
        dist = config.is_distributed
        out = []
        for sid, g in config.parts:
            c = self.space.klass_of.get(sid)
            out.append((sid, (g, dist and c is not None and g < self.space.classes[c].free)))
        return out

    def has_tail(self, sid: ServerId) -> bool:
        return any(tail for _, tail in self.items.get(sid, ()))

    def fits(self, config: Configuration) -> bool:
        return all(
            self.free.get(sid, 0) >= g and not (tail and self.has_tail(sid))
            for sid, (g, tail) in self._items(config)
        )

    def take(self, config: Configuration) -> None:
        if not self.fits(config):
            raise RuntimeError(f"configuration {config} over-allocates a server")
        for sid, item in self._items(config):
            self.free[sid] -= item[0]
            if self.space.klass_of:
                self.items.setdefault(sid, []).append(item)

    def release(self, config: Configuration) -> None:
        """Undo :meth:`take` of ``config``."""
        for sid, item in self._items(config):
            self.free[sid] = self.free.get(sid, 0) + item[0]
            if self.space.klass_of:
                held = self.items[sid]
                held.remove(item)
                if not held:
                    # An empty server holds no pattern (see incumbent_values).
                    del self.items[sid]

    def place(self, opt: PassOption) -> Configuration | None:
        """Where the option fits now (first fit within a class), or None."""
        if opt.config is not None:
            return opt.config if self.fits(opt.config) else None
        assert opt.klass is not None
        klass = self.space.classes[opt.klass.klass]
        if not opt.klass.distributed:
            sid = next((s for s in klass.servers if self.free[s] >= opt.klass.part), None)
            return None if sid is None else Configuration(((sid, opt.klass.part),))
        return self._place_distributed(klass, opt.klass)

    def _place_distributed(self, klass: ServerClass, o: ClassOption) -> Configuration | None:
        whole = [s for s in klass.servers if self.free[s] == klass.free]
        if len(whole) < o.full:
            return None
        parts = dict.fromkeys(_first_run(klass.servers, set(whole), o.full) or whole[: o.full],
                              klass.free)
        if o.part:
            # Prefer a partly used server for the tail, keeping whole ones free.
            hosts = [s for s in klass.servers if s not in parts and self.free[s] >= o.part
                     and not self.has_tail(s)]
            host = next((s for s in hosts if self.free[s] < klass.free), None)
            if host is None and not hosts:
                return None
            parts[host or hosts[0]] = o.part
        return Configuration.of(parts)


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
    shape = sorted((g for _, g in current.parts), reverse=True)
    for o in space.per_job[i]:
        opt = space.options[o]
        if opt.config is not None:
            if opt.config == current:
                return o
        elif opt.klass is not None and opt.gpus == current.total_gpus:
            c = opt.klass.klass
            klass = space.classes[c]
            same_class = all(space.klass_of.get(s) == c for s in current.servers)
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
    groups: dict[tuple[int, float, int], list[int]] = {}
    for o, opt in enumerate(space.options):
        groups.setdefault((opt.job, opt.gain, opt.gpus), []).append(o)
    per_job: dict[int, list[tuple[float, list[int]]]] = {}
    for (job, _, _), members in groups.items():
        weight = round(sum(x[o] for o in members), 6)
        if weight > 1e-6:
            members.sort(key=lambda o: -x[o])
            per_job.setdefault(job, []).append((weight, members))
    for shapes in per_job.values():
        shapes.sort(key=lambda t: (-t[0], -coeffs[t[1][0]], t[1][0]))
    order = sorted(per_job, key=lambda j: (-per_job[j][0][0],
                                           -space.options[per_job[j][0][1][0]].gpus, j))
    return [[members for _, members in per_job[j]] for j in order]


def _lp_rounding(
    space: OptionSpace, x: Sequence[float] | npt.NDArray[np.float64], coeffs: Sequence[float],
    free: Mapping[ServerId, int],
) -> tuple[Assignment, PlanState]:
    """Round the LP relaxation (see :func:`_shapes`) onto any servers that fit,
    then let the jobs left take what remains by objective per GPU."""
    state = PlanState(space, free)
    chosen: Assignment = {}
    for shapes in _shapes(space, x, coeffs):
        for o in (o for members in shapes for o in members):
            config = state.place(space.options[o])
            if config is not None:
                state.take(config)
                chosen[space.options[o].job] = (o, config)
                break
    return _top_up(space, coeffs, state, chosen), state


def _top_up(
    space: OptionSpace, coeffs: Sequence[float], state: PlanState, chosen: Assignment
) -> Assignment:
    """Complete a warm start: jobs without a configuration take what is left,
    best objective per GPU first (what is left is scarce)."""
    rest = sorted((o for o, opt in enumerate(space.options) if opt.job not in chosen),
                  key=lambda o: (-coeffs[o] / space.options[o].gpus, o))
    for o in rest:
        opt = space.options[o]
        if opt.job not in chosen and (config := state.place(opt)) is not None:
            state.take(config)
            chosen[opt.job] = (o, config)
    return chosen


def _from_hint(
    space: OptionSpace, coeffs: Sequence[float], hint: Mapping[int, Configuration],
    free: Mapping[ServerId, int],
) -> tuple[Assignment, PlanState]:
    """Keep the hinted configurations that are options here and still fit;
    a hinted job whose configuration is not (e.g. a class plan's distributed
    configuration that is not adjacent) takes its best option of the same
    size that fits. Then top up."""
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
    return _top_up(space, coeffs, state, chosen), state


def warm_start(
    space: OptionSpace, coeffs: Sequence[float], free: Mapping[ServerId, int], n_jobs: int,
    relaxed: Sequence[float] | npt.NDArray[np.float64] | None,
    hints: Sequence[Mapping[int, Configuration]],
) -> tuple[Assignment, PlanState]:
    """The best of: each hint (the jobs' current configurations, a class
    solution), the rounded LP relaxation, and the greedy pass."""
    starts = [_from_hint(space, coeffs, hint, free) for hint in hints if hint]
    if relaxed is not None:
        starts.append(_lp_rounding(space, relaxed, coeffs, free))
    state = PlanState(space, free)
    starts.append((greedy_assign(space, state, n_jobs, {}), state))
    return max(starts, key=lambda s: _value(s[0], coeffs))


def _value(assignment: Assignment, coeffs: Sequence[float]) -> float:
    return sum(coeffs[o] for o, _ in assignment.values())


def fill_leftovers(
    space: OptionSpace, free: Mapping[ServerId, int], n_jobs: int, assignment: Assignment
) -> Assignment:
    """Apply a solution, then let the jobs left without one take what is left."""
    state = PlanState(space, free)
    for _, config in assignment.values():
        state.take(config)
    return greedy_assign(space, state, n_jobs, dict(assignment))
