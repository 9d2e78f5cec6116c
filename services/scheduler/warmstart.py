"""Starting points and completions for a pass's MIP (see
:mod:`services.scheduler.passes`): the greedy order, the rounded LP
relaxation, hints (current configurations, the class formulation's plan), a
local search on the best of them, and filling what a solution leaves idle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from services.scheduler.classes import ClassOption, Item, ServerClass
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
        # Idle GPUs per class: an option needing more cannot fit anywhere in
        # it, which spares the local search most server scans.
        self.idle = [0] * len(space.classes)
        for sid, g in self.free.items():
            if (c := space.klass_of.get(sid)) is not None:
                self.idle[c] += g
        # Without classes every item is (GPUs, no tail): fits/take/release
        # then read the configuration's parts directly.
        self._plain = not space.klass_of
        self._memo: dict[Configuration, list[tuple[ServerId, Item]]] = {}

    def _count(self, sid: ServerId, gpus: int) -> None:
        if (c := self.space.klass_of.get(sid)) is not None:
            self.idle[c] += gpus

    def _items(self, config: Configuration) -> list[tuple[ServerId, Item]]:
        # In a class, a distributed configuration's part below the class's
        # idle GPUs is its tail; direct mode keeps no items. A function of
        # the configuration and the (fixed) space, so memoised.
        out = self._memo.get(config)
        if out is not None:
            return out
        dist = config.is_distributed
        out = []
        for sid, g in config.parts:
            c = self.space.klass_of.get(sid)
            out.append((sid, (g, dist and c is not None and g < self.space.classes[c].free)))
        self._memo[config] = out
        return out

    def has_tail(self, sid: ServerId) -> bool:
        return any(tail for _, tail in self.items.get(sid, ()))

    def fits(self, config: Configuration) -> bool:
        free = self.free
        if self._plain:
            parts = config.parts
            if len(parts) == 1:
                return free.get(parts[0][0], 0) >= parts[0][1]
            return all(free.get(sid, 0) >= g for sid, g in parts)
        for sid, (g, tail) in self._items(config):
            if free.get(sid, 0) < g or (tail and self.has_tail(sid)):
                return False
        return True

    def take(self, config: Configuration) -> None:
        if not self.fits(config):
            raise RuntimeError(f"configuration {config} over-allocates a server")
        if self._plain:
            for sid, g in config.parts:
                self.free[sid] -= g
            return
        for sid, item in self._items(config):
            self.free[sid] -= item[0]
            if self.space.klass_of:
                self.items.setdefault(sid, []).append(item)
                self._count(sid, -item[0])

    def release(self, config: Configuration) -> None:
        """Undo :meth:`take` of ``config``."""
        if self._plain:
            for sid, g in config.parts:
                self.free[sid] = self.free.get(sid, 0) + g
            return
        for sid, item in self._items(config):
            self.free[sid] = self.free.get(sid, 0) + item[0]
            if self.space.klass_of:
                self._count(sid, item[0])
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
        if self.idle[opt.klass.klass] < opt.gpus:
            return None
        klass = self.space.classes[opt.klass.klass]
        if not opt.klass.distributed:
            sid = next((s for s in klass.servers if self.free[s] >= opt.klass.part), None)
            return None if sid is None else Configuration(((sid, opt.klass.part),))
        return self._place_distributed(klass, opt.klass)

    def _place_distributed(self, klass: ServerClass, o: ClassOption) -> Configuration | None:
        whole = [s for s in klass.servers if self.free[s] == klass.free]
        if len(whole) < o.full:
            return None
        parts = dict.fromkeys(
            _first_run(klass.servers, set(whole), o.full) or whole[: o.full], klass.free
        )
        if o.part:
            # Prefer a partly used server for the tail, keeping whole ones free.
            hosts = [
                s
                for s in klass.servers
                if s not in parts and self.free[s] >= o.part and not self.has_tail(s)
            ]
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
    order = sorted(
        per_job, key=lambda j: (-per_job[j][0][0], -space.options[per_job[j][0][1][0]].gpus, j)
    )
    return [[members for _, members in per_job[j]] for j in order]


def _lp_rounding(
    space: OptionSpace,
    x: Sequence[float] | npt.NDArray[np.float64],
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
) -> tuple[Assignment, PlanState]:
    """Round the LP relaxation (see :func:`_shapes`) onto any servers that fit,
    then let the jobs left take what remains by objective per GPU."""
    state = PlanState(space, free)
    chosen: Assignment = {}
    # Columns the LP takes whole go first: a job the LP keeps on its current
    # option (the switch factor favours exactly that column) keeps it, before
    # a job split over interchangeable columns lands there by first fit.
    whole = sorted(
        (o for o in range(len(space.options)) if x[o] > 1 - 1e-6),
        key=lambda o: (-space.options[o].gpus, o),
    )
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
    return _top_up(space, coeffs, state, chosen), state


def _top_up(
    space: OptionSpace, coeffs: Sequence[float], state: PlanState, chosen: Assignment
) -> Assignment:
    """Complete a warm start: jobs without a configuration take what is left,
    best objective per GPU first (what is left is scarce)."""
    rest = sorted(
        (o for o, opt in enumerate(space.options) if opt.job not in chosen),
        key=lambda o: (-coeffs[o] / space.options[o].gpus, o),
    )
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
    space: OptionSpace,
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
    n_jobs: int,
    relaxed: Sequence[float] | npt.NDArray[np.float64] | None,
    hints: Sequence[Mapping[int, Configuration]],
    enough: float = math.inf,
) -> tuple[Assignment, PlanState]:
    """The best of: each hint (the jobs' current configurations, a class
    solution), the rounded LP relaxation, and the greedy pass, improved by
    local search (:func:`improve`) until it is worth ``enough``."""
    starts = [_from_hint(space, coeffs, hint, free) for hint in hints if hint]
    if relaxed is not None:
        starts.append(_lp_rounding(space, relaxed, coeffs, free))
    state = PlanState(space, free)
    starts.append((greedy_assign(space, state, n_jobs, {}), state))
    chosen, state = max(starts, key=lambda s: _value(s[0], coeffs))
    return improve(space, coeffs, state, chosen, enough), state


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


# A move must raise the objective by more than this (relative to the moved
# coefficients), so rounding noise cannot make the search cycle.
_EPS = 1e-9
# Bounds on the swap neighbourhood per job: its best options, and for each the
# cheapest jobs in the way. They keep the search well below a MIP solve.
_SWAP_OPTIONS = 6
_SWAP_VICTIMS = 6
_PASSES = 3


class _Search:
    """1-opt and swap moves on a complete plan. The starts are feasible but
    blind to what the solver proves (the rounding ignores the switch factor,
    hints ignore better options), and a start within the gap of the root bound
    lets HiGHS stop at the root. ``state`` and ``chosen`` are updated in place."""

    def __init__(
        self, space: OptionSpace, coeffs: Sequence[float], state: PlanState, chosen: Assignment
    ) -> None:
        self.space, self.coeffs, self.state, self.chosen = space, coeffs, state, chosen
        # Stable sort: ties keep the greedy order (fewer GPUs, cluster order).
        self.ranked = [sorted(opts, key=lambda o: -coeffs[o]) for opts in space.per_job]
        self.on: dict[ServerId, set[int]] = {}
        for i, (_, config) in chosen.items():
            for sid in config.servers:
                self.on.setdefault(sid, set()).add(i)

    def value(self, i: int) -> float:
        held = self.chosen.get(i)
        return self.coeffs[held[0]] if held is not None else 0.0

    def drop(self, i: int) -> tuple[int, Configuration] | None:
        held = self.chosen.pop(i, None)
        if held is not None:
            self.state.release(held[1])
            for sid in held[1].servers:
                self.on[sid].discard(i)
        return held

    def put(self, i: int, held: tuple[int, Configuration] | None) -> None:
        if held is None:
            return
        self.state.take(held[1])
        self.chosen[i] = held
        for sid in held[1].servers:
            self.on.setdefault(sid, set()).add(i)

    def best_fit(self, i: int, above: float) -> tuple[int, Configuration] | None:
        """Job i's best option worth more than ``above`` that fits now."""
        coeffs, options, place = self.coeffs, self.space.options, self.state.place
        for o in self.ranked[i]:
            if coeffs[o] <= above:
                return None
            config = place(options[o])
            if config is not None:
                return o, config
        return None

    def upgrade(self, i: int) -> bool:
        """Job i moves to a better option that fits in what it frees."""
        cur = self.value(i)
        old = self.drop(i)
        new = self.best_fit(i, cur + _EPS * cur)
        self.put(i, new or old)
        return new is not None

    def _victims(self, i: int, o: int) -> list[int]:
        """The cheapest other jobs on the servers option o could use."""
        opt = self.space.options[o]
        if opt.config is not None:
            servers: Sequence[ServerId] = opt.config.servers
        else:
            assert opt.klass is not None
            servers = self.space.classes[opt.klass.klass].servers
        jobs = {j for sid in servers for j in self.on.get(sid, ()) if j != i}
        return sorted(jobs, key=lambda j: (self.value(j), j))[:_SWAP_VICTIMS]

    def swap(self, i: int) -> bool:
        """Job i takes a better option in place of cheaper jobs, which then
        take the best options still left to them, when that raises the
        objective."""
        cur = self.value(i)
        for o in self.ranked[i][:_SWAP_OPTIONS]:
            if self.coeffs[o] <= cur + _EPS * cur:
                return False
            if self._try_eject(i, o, self._victims(i, o)):
                return True
        return False

    def _try_eject(self, i: int, o: int, victims: Sequence[int]) -> bool:
        """Drop job i and then victims, cheapest first, until option o fits;
        re-place the victims, dearest first; keep the result if it is better."""
        before = self.value(i)
        old = {i: self.drop(i)}
        config = self.state.place(self.space.options[o])
        for j in victims:
            if config is not None:
                break
            before += self.value(j)
            old[j] = self.drop(j)
            config = self.state.place(self.space.options[o])
        if config is not None:
            self.put(i, (o, config))
            # Victims were dropped cheapest first: re-place the dearest first.
            for j in reversed([j for j in old if j != i]):
                self.put(j, self.best_fit(j, 0.0))
            if sum(self.value(j) for j in old) > before * (1 + _EPS):
                return True
            for j in old:
                self.drop(j)
        for j in reversed(list(old)):
            self.put(j, old[j])
        return False


def improve(
    space: OptionSpace,
    coeffs: Sequence[float],
    state: PlanState,
    chosen: Assignment,
    enough: float = math.inf,
) -> Assignment:
    """Local search on a plan (see :class:`_Search`): jobs by their best
    coefficient, each first trying to move up into idle GPUs, then to swap
    with cheaper jobs; a few passes while anything moves, stopping once the
    objective reaches ``enough``. Deterministic."""
    search = _Search(space, coeffs, state, chosen)
    order = sorted(
        range(len(space.per_job)),
        key=lambda i: (-coeffs[search.ranked[i][0]] if search.ranked[i] else 0.0, i),
    )
    total = _value(chosen, coeffs)
    for _ in range(_PASSES):
        moved = False
        for i in order:
            if total >= enough:
                return chosen
            if search.ranked[i] and (search.upgrade(i) or search.swap(i)):
                moved = True
                total = _value(chosen, coeffs)
        if not moved:
            break
    return chosen
