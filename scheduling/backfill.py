"""EASY backfill's rule (Lifka, "The ANL/IBM SP scheduling system",
JSSPP'95; Mu'alem and Feitelson, IEEE TPDS 12(6), 2001; Slurm's
``sched/backfill``), in one place for the two schedulers that apply it: the
Slurm-style baseline (:mod:`scheduling.policies.slurm.backfill`, which counts
GPUs per server and places with its own placer) and Hops' ``reserve_head``
(:mod:`scheduling.policies.hops.reserve`, which counts GPUs per GPU type).

The rule has two halves:

- :func:`shadow`: the head of the queue, which does not fit now, is reserved
  the earliest time (its *shadow time*) at which it fits as the running jobs
  end, taken in the order of their ends, and what it would hold then;
- a later job may start now only if it cannot delay that start: it ends by
  the shadow time (:func:`ends_by`), or it holds only units the reservation
  leaves over at the shadow time (:func:`spare`).

The units are counted per key ``K`` (a server, a GPU type): what a key has is
all the rule needs. Pure: times are numbers the caller gives, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
P = TypeVar("P")

# A running job's end and the units it frees then, per key.
Release = tuple[float, Iterable[tuple[K, int]]]


@dataclass(frozen=True)
class Shadow(Generic[K, P]):
    """The head's shadow time ``start`` (never before now), the units free
    then with its own not yet taken (``free``), and where it fits then
    (``fit``: what the caller's fit returned)."""

    start: float
    free: dict[K, int]
    fit: P


def shadow(
    free: Mapping[K, int],
    releases: Sequence[Release[K]],
    now: float,
    fit: Callable[[Mapping[K, int]], P | None],
) -> Shadow[K, P] | None:
    """The earliest time the head fits: on ``free`` now, else after each
    release in the order of the ends (equal ends in the caller's order, so
    that the caller's tie-break decides where the head is placed); None if
    it does not fit even once every release is in. ``fit`` says where the
    head goes on the units free (None: nowhere)."""
    future = dict(free)
    found = fit(future)
    if found is not None:
        return Shadow(now, future, found)
    for end, units in sorted(releases, key=lambda r: r[0]):
        for key, n in units:
            future[key] = future.get(key, 0) + n
        found = fit(future)
        if found is not None:
            return Shadow(max(now, end), future, found)
    return None


def ends_by(now: float, run_s: float, start: float) -> bool:
    """A job started ``now`` for ``run_s`` seconds (its time limit, or its
    estimated run) is gone by the shadow time ``start``: whatever it holds
    is free again when the head starts, so it may take any unit free now."""
    return now + run_s <= start


def spare(
    now_free: Mapping[K, int],
    start_free: Mapping[K, int],
    reserved: Iterable[tuple[K, int]],
) -> dict[K, int]:
    """Per key, the units a job that outlives the shadow time may take: free
    now, and still free at the shadow time beyond the head's share
    (``start_free`` less what longer jobs started already hold then)."""
    need = dict(reserved)
    keys = set(now_free) | set(start_free)
    return {k: max(0, min(now_free.get(k, 0), start_free.get(k, 0) - need.get(k, 0)))
            for k in keys}
