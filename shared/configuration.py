"""Location-specific configurations (Hops §3.4): ``{server_id: gpus}``, and
the other resources (CPU cores, memory) a job holds on each of those servers."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.ids import ServerId
from shared.resources import NOTHING, Resources


class Configuration(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """GPUs a job holds on each server, e.g. ``{0: 2, 2: 4}`` is 6 GPUs on two
    servers. One server makes it *aggregated*, several make it *distributed*.

    ``parts`` is kept sorted by server id, so equal configurations compare and
    hash equal whatever order they were built in.

    ``extras`` holds the resources other than GPUs the job holds on each
    server of ``parts``, in the same order (CPU cores, memory); empty, the
    job holds GPUs only, which is all the policies of Hops, Sia and Gavel
    plan. The GPU ``parts`` alone are what the estimator's Eq. (1) reads.

    A CPU job (CODA) holds cores and no GPUs: its parts name 0 GPUs, and
    every such part holds cores (:meth:`cpu`).

    ``mba_percent`` caps the memory bandwidth of each of the job's cores at
    that share of a core's full bandwidth, by Intel Memory Bandwidth
    Allocation (CODA §V-D: the contention eliminator throttles CPU jobs so);
    100, the default, is no cap. A change of it alone is made in place,
    like a change of cores.
    """

    parts: tuple[tuple[ServerId, int], ...]
    extras: tuple[Resources, ...] = ()
    mba_percent: int = 100

    def __post_init__(self) -> None:
        parts = self.parts
        if not 1 <= self.mba_percent <= 100:
            raise ValueError(f"configuration: mba_percent must lie in 1..100, "
                             f"got {self.mba_percent}")
        if len(parts) == 1 and parts[0][1] > 0 and not self.extras:
            return  # the common case, valid by the checks below
        if not parts:
            raise ValueError("a configuration needs at least one server")
        seen: set[str] = set()
        for i, (sid, gpus) in enumerate(self.parts):
            if gpus < 0 or (gpus == 0 and (not self.extras or i >= len(self.extras)
                                           or not self.extras[i].cores)):
                raise ValueError(f"configuration: server {sid} gets {gpus} GPUs, need > 0 "
                                 "(or 0 GPUs with cores: a CPU job)")
            if sid in seen:
                raise ValueError(f"configuration: server {sid} appears twice")
            seen.add(sid)
        if list(self.parts) != sorted(self.parts):
            raise ValueError("configuration parts must be sorted by server id; use of_dict()")
        if self.extras:
            if len(self.extras) != len(parts):
                raise ValueError(f"configuration: {len(self.extras)} extras for "
                                 f"{len(parts)} servers")
            if any(e.gpus for e in self.extras):
                raise ValueError("configuration: GPUs belong in parts, not in extras")

    @classmethod
    def of(cls, mapping: Mapping[ServerId, int] | Mapping[str, int]) -> Configuration:
        return cls(tuple(sorted((ServerId(k), int(v)) for k, v in mapping.items())))

    @classmethod
    def cpu(cls, server: ServerId, cores: int, mba_percent: int = 100) -> Configuration:
        """A CPU job's configuration: ``cores`` on ``server``, no GPUs, its
        memory bandwidth capped at ``mba_percent``."""
        return cls(((server, 0),), (Resources(cores=cores),), mba_percent)

    @property
    def total_cores(self) -> int:
        return sum(e.cores for e in self.extras)

    def cores_on(self, server: ServerId) -> int:
        return self.demand_on(server).cores

    @property
    def total_gpus(self) -> int:
        parts = self.parts
        return parts[0][1] if len(parts) == 1 else sum(g for _, g in parts)

    @property
    def num_nodes(self) -> int:
        return len(self.parts)

    @property
    def is_distributed(self) -> bool:
        return len(self.parts) > 1

    @property
    def servers(self) -> tuple[ServerId, ...]:
        parts = self.parts
        return (parts[0][0],) if len(parts) == 1 else tuple([s for s, _ in parts])

    def as_dict(self) -> dict[ServerId, int]:
        return dict(self.parts)

    def with_extras(self, extras: Mapping[ServerId, Resources]) -> Configuration:
        """This configuration holding ``extras`` (no GPUs) on its servers; a
        server not named holds none. All zero: the GPUs-only configuration."""
        unknown = sorted(set(extras) - set(self.servers))
        if unknown:
            raise ValueError(f"configuration {self}: {unknown[0]} is not one of its servers")
        row = tuple(extras.get(s, NOTHING) for s, _ in self.parts)
        return Configuration(self.parts, () if all(e.is_zero for e in row) else row,
                             self.mba_percent)

    @property
    def gpus_only(self) -> Configuration:
        """The GPUs alone: no extras, no bandwidth cap."""
        return Configuration(self.parts) if self.extras or self.mba_percent < 100 else self

    def demand_on(self, server: ServerId) -> Resources:
        """Everything the job holds on ``server`` (nothing if not one of its)."""
        for i, (s, g) in enumerate(self.parts):
            if s == server:
                extra = self.extras[i] if self.extras else NOTHING
                return Resources(gpus=g, cores=extra.cores, memory_mb=extra.memory_mb)
        return NOTHING

    def demands(self) -> dict[ServerId, Resources]:
        """Everything the job holds, per server."""
        if not self.extras:
            return {s: Resources(gpus=g) for s, g in self.parts}
        return {s: self.demand_on(s) for s in self.servers}

    def __str__(self) -> str:
        cap = f" mba {self.mba_percent}%" if self.mba_percent < 100 else ""
        if not self.extras:
            return "{" + ", ".join(f"{s}:{g}" for s, g in self.parts) + "}" + cap
        return "{" + ", ".join(f"{s}:{g}" + (f" ({e})" if not e.is_zero else "")
                               for (s, g), e in zip(self.parts, self.extras,
                                                    strict=True)) + "}" + cap
