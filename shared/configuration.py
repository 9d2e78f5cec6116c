"""Location-specific configurations (Hops §3.4): ``{server_id: gpus}``."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.ids import ServerId


class Configuration(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """GPUs a job holds on each server, e.g. ``{0: 2, 2: 4}`` is 6 GPUs on two
    servers. One server makes it *aggregated*, several make it *distributed*.

    ``parts`` is kept sorted by server id, so equal configurations compare and
    hash equal whatever order they were built in.
    """

    parts: tuple[tuple[ServerId, int], ...]

    def __post_init__(self) -> None:
        parts = self.parts
        if len(parts) == 1 and parts[0][1] > 0:
            return  # the common case, valid by the checks below
        if not parts:
            raise ValueError("a configuration needs at least one server")
        seen: set[str] = set()
        for sid, gpus in self.parts:
            if gpus <= 0:
                raise ValueError(f"configuration: server {sid} gets {gpus} GPUs, need > 0")
            if sid in seen:
                raise ValueError(f"configuration: server {sid} appears twice")
            seen.add(sid)
        if list(self.parts) != sorted(self.parts):
            raise ValueError("configuration parts must be sorted by server id; use of_dict()")

    @classmethod
    def of(cls, mapping: Mapping[ServerId, int] | Mapping[str, int]) -> Configuration:
        return cls(tuple(sorted((ServerId(k), int(v)) for k, v in mapping.items())))

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

    def __str__(self) -> str:
        return "{" + ", ".join(f"{s}:{g}" for s, g in self.parts) + "}"
