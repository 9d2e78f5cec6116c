"""A plan being assembled for a pass (see :mod:`scheduling.policies.hops.passes`):
the idle GPUs per server and the items each server holds, which the warm
starts (:mod:`scheduling.policies.hops.warmstart`) and the local search
(:mod:`scheduling.policies.hops.localsearch`) build and change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduling.policies.hops.classes import ClassOption, Item, ServerClass
from scheduling.policies.hops.formulation import Assignment, OptionSpace, PassOption
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


def plan_value(assignment: Assignment, coeffs: Sequence[float]) -> float:
    """Eq. (11) of a plan: the sum of its options' coefficients."""
    return sum(coeffs[o] for o, _ in assignment.values())
