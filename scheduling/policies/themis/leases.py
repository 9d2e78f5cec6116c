"""Themis' leases (NSDI'20 §4.2): GPUs won are held for a lease, then go
back to the arbiter to be offered again. A job's lease start is the
policy's state, kept between plans in the plan's layer state under
:data:`STATE`."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from shared.ids import JobId

STATE = "themis-leases"  # the LayerRecord name the state travels under


class Leases(msgspec.Struct, frozen=True):
    """When each job holding GPUs last won them."""

    since: dict[JobId, float] = {}


def decode(blob: bytes | None) -> Leases:
    return msgspec.msgpack.decode(blob, type=Leases) if blob else Leases()


def encode(leases: Leases) -> bytes:
    return msgspec.msgpack.encode(leases)


def live(leases: Leases, job_id: JobId, now: float, lease_s: float) -> bool:
    """Whether the job's lease still runs at ``now``."""
    start = leases.since.get(job_id)
    return start is not None and now - start < lease_s


def renewed(leases: Leases, held: Iterable[JobId], won: Iterable[JobId], now: float) -> Leases:
    """The leases after a plan: ``held`` keep their start, ``won`` start at
    ``now``, every other job's lease is gone."""
    since = {j: leases.since[j] for j in held if j in leases.since}
    since.update({j: now for j in won if j not in since})
    return Leases(since)
