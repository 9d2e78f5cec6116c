"""What the core layer remembers from plan to plan (``LayerRecord.state``):
the simulator threads it, the live leader keeps it in KV, so a standby
plans the same."""

from __future__ import annotations

import msgspec

from scheduling.cores.allocator import Climb
from shared.ids import JobId

HISTORY = 20
"""Settled values kept per owner and category (the most recent): CODA's
start point is the largest of them (§V-B-1); this project's bound."""


class CoreState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``climbs``: the adaptive allocator's search of each GPU job that
    runs or ran (settled ones keep their value); ``history``: settled cores
    per GPU by ``tenant/category``; ``borrowers``: CPU jobs on cores
    reserved for GPU jobs, with the time each started there; ``head``: CPU
    jobs stopped to give reserved cores back, served first (§V-C);
    ``paused``: climbs that wanted more cores than their servers had, as
    they were (their ``current`` the value wanted), resumed when a plan
    finds the room; ``large_gpus``: the most GPUs large jobs held at once (sizes the large
    sub-array); ``retunes``: in-place core changes per job."""

    climbs: dict[JobId, Climb] = {}
    history: dict[str, tuple[int, ...]] = {}
    borrowers: dict[JobId, float] = {}
    head: tuple[JobId, ...] = ()
    large_gpus: int = 0
    retunes: dict[JobId, int] = {}
    paused: dict[JobId, Climb] = {}


def decode(data: bytes) -> CoreState:
    return msgspec.msgpack.decode(data, type=CoreState) if data else CoreState()


def encode(state: CoreState) -> bytes:
    return msgspec.msgpack.encode(state)


def history_key(tenant: str, category: str) -> str:
    return f"{tenant}/{category}"


def remember(history: dict[str, tuple[int, ...]], key: str, value: int) -> None:
    history[key] = (*history.get(key, ()), value)[-HISTORY:]
