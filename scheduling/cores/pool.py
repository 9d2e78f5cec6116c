"""Small pure helpers of the core layer: GPUs usable given cores, best-fit
placement of a CPU job, and which borrower CODA stops first (§V-C)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.ids import JobId, ServerId


def gpus_usable(free_gpus: Mapping[ServerId, int], room: Mapping[ServerId, int],
                per_gpu: int) -> dict[ServerId, int]:
    """GPUs of each server a plan may give when every GPU needs at least
    ``per_gpu`` cores beside it: the rest are held from the inner policy."""
    step = max(1, per_gpu)
    return {s: min(g, max(0, room.get(s, 0)) // step) for s, g in free_gpus.items()}


def best_fit(rooms: Mapping[ServerId, int], cores: int,
             servers: Iterable[ServerId]) -> ServerId | None:
    """The server whose room fits ``cores`` most tightly (ties: server
    order), so that large holes stay for large jobs; None if none fits."""
    fits = [(rooms.get(s, 0), i, s) for i, s in enumerate(servers) if rooms.get(s, 0) >= cores]
    return min(fits)[2] if fits else None


def youngest_first(borrowers: Mapping[JobId, float], on: Iterable[JobId]) -> list[JobId]:
    """The borrowing CPU jobs ``on`` a server, youngest first: CODA stops
    the youngest when a GPU job needs its cores (§V-C)."""
    return sorted(on, key=lambda j: (-borrowers.get(j, 0.0), j))
