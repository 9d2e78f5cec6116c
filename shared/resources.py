"""Named resources: what a server has and what a job holds on it.

GPUs are the resource every policy plans today; CPU cores (CODA) and host
memory are the next. A :class:`Resources` vector names each, so a server's
capacity, a configuration's demand on a server and a booking are one type,
and "fits" means fits in every resource, the way Kubernetes compares
resource lists and Slurm its trackable resources (TRES).

:class:`Ledger` is the one bookkeeping of who holds what on which server.
The simulator, the placer and the node executors book through it, so no
server is ever over-allocated in any resource, whichever of them decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Literal

import msgspec

from shared.ids import ServerId

ResourceName = Literal["gpus", "cores", "memory_mb"]
RESOURCE_NAMES: tuple[ResourceName, ...] = ("gpus", "cores", "memory_mb")
UNITS: dict[ResourceName, str] = {"gpus": "GPUs", "cores": "CPU cores", "memory_mb": "MiB"}


class Resources(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A vector of named, non-negative integer resources (absent: zero)."""

    gpus: int = 0
    cores: int = 0
    memory_mb: int = 0

    def __post_init__(self) -> None:
        g, c, m = self.gpus, self.cores, self.memory_mb
        if type(g) is int and type(c) is int and type(m) is int and g >= 0 and c >= 0 and m >= 0:
            return  # valid: the common case, checked without a loop (the simulator's hot path)
        for name in RESOURCE_NAMES:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"resources: {name} must be an integer >= 0, got {value!r}")

    def __getitem__(self, name: ResourceName) -> int:
        value: int = getattr(self, name)
        return value

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cores + other.cores,
                         self.memory_mb + other.memory_mb)

    def minus(self, other: Resources) -> Resources:
        """``self - other``, each resource clamped at zero (what is left free)."""
        return Resources(max(0, self.gpus - other.gpus), max(0, self.cores - other.cores),
                         max(0, self.memory_mb - other.memory_mb))

    def short_of(self, capacity: Resources) -> tuple[ResourceName, ...]:
        """The resources of which ``self`` needs more than ``capacity`` has."""
        return tuple(n for n in RESOURCE_NAMES if self[n] > capacity[n])

    def fits_in(self, capacity: Resources) -> bool:
        return (self.gpus <= capacity.gpus and self.cores <= capacity.cores
                and self.memory_mb <= capacity.memory_mb)

    @property
    def is_zero(self) -> bool:
        return not (self.gpus or self.cores or self.memory_mb)

    def items(self) -> Iterator[tuple[ResourceName, int]]:
        """The non-zero resources, in :data:`RESOURCE_NAMES` order."""
        return ((n, self[n]) for n in RESOURCE_NAMES if self[n])

    def __str__(self) -> str:
        return ", ".join(f"{v} {UNITS[n]}" for n, v in self.items()) or "nothing"


NOTHING = Resources()


def total(vectors: Iterable[Resources]) -> Resources:
    out = NOTHING
    for v in vectors:
        out = out + v
    return out


class OverAllocation(ValueError):
    """A booking that would hold more of a resource than a server has."""


class Ledger:
    """Who holds what on each server, checked against its capacity in every
    resource. A holder (a job, a profiling run) books a demand per server
    at once or not at all, and releases all of it at once."""

    def __init__(self, capacity: Mapping[ServerId, Resources]) -> None:
        self.capacity: dict[ServerId, Resources] = dict(capacity)
        self._used: dict[ServerId, Resources] = {}
        self._held: dict[str, dict[ServerId, Resources]] = {}

    def used(self, server: ServerId) -> Resources:
        return self._used.get(server, NOTHING)

    def free(self, server: ServerId) -> Resources:
        return self.capacity.get(server, NOTHING).minus(self.used(server))

    def held_by(self, holder: str) -> dict[ServerId, Resources]:
        return dict(self._held.get(holder, {}))

    def holders(self) -> tuple[str, ...]:
        return tuple(self._held)

    def refusal(self, demands: Mapping[ServerId, Resources], holder: str = "") -> str | None:
        """Why ``demands`` cannot be booked now (naming the first server and
        resource short), or None when it can. ``holder``'s own bookings do
        not count against it: a holder may book again to change what it holds."""
        own = self._held.get(holder, {})
        for server, want in sorted(demands.items()):
            capacity = self.capacity.get(server)
            if capacity is None:
                return f"server {server} is unknown"
            used = self._used.get(server, NOTHING)
            mine = own.get(server, NOTHING)
            if (want.gpus + used.gpus - mine.gpus <= capacity.gpus
                    and want.cores + used.cores - mine.cores <= capacity.cores
                    and want.memory_mb + used.memory_mb - mine.memory_mb <= capacity.memory_mb):
                continue  # fits: the common case, without building vectors
            free = capacity.minus(used.minus(mine))
            short = want.short_of(free)
            if short:
                name = short[0]
                return (f"{server} has {free[name]} {UNITS[name]} free of {capacity[name]}, "
                        f"{want[name]} needed")
        return None

    def book(self, holder: str, demands: Mapping[ServerId, Resources]) -> None:
        """Book ``demands`` for ``holder`` (replacing what it held), or raise
        :class:`OverAllocation` and change nothing."""
        why = self.refusal(demands, holder)
        if why is not None:
            raise OverAllocation(f"{holder}: {why}")
        self.release(holder)
        kept = {s: d for s, d in demands.items() if not d.is_zero}
        for server, want in kept.items():
            self._used[server] = self.used(server) + want
        if kept:
            self._held[holder] = kept

    def release(self, holder: str) -> dict[ServerId, Resources]:
        """Release all ``holder`` holds; returns what it held."""
        held = self._held.pop(holder, {})
        for server, want in held.items():
            left = self.used(server).minus(want)
            if left.is_zero:
                self._used.pop(server, None)
            else:
                self._used[server] = left
        return held
