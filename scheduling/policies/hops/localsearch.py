"""Local search on a pass's warm start (see :mod:`scheduling.policies.hops.warmstart`):
1-opt and swap moves that raise Eq. (11) before HiGHS gets the plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduling.policies.hops.formulation import Assignment, OptionSpace
from scheduling.policies.hops.planstate import PlanState, plan_value
from shared.configuration import Configuration
from shared.ids import ServerId

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
    total = plan_value(chosen, coeffs)
    for _ in range(_PASSES):
        moved = False
        for i in order:
            if total >= enough:
                return chosen
            if search.ranked[i] and (search.upgrade(i) or search.swap(i)):
                moved = True
                total = plan_value(chosen, coeffs)
        if not moved:
            break
    return chosen
