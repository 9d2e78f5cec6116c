"""Reasons that need no capacity analysis: the record-level ones the live
shell gives jobs it keeps out of every snapshot (``Held``,
``Unschedulable``, ``NodeDrained``), and the ones the layers give the jobs
they hold back or remove (``Quota``, ``TenantCells``, ``Cores``;
``LayerRecord.why``). Plain functions returning :class:`shared.explain.Why`;
their messages never name a job (:func:`shared.explain.render` does)."""

from __future__ import annotations

from collections.abc import Collection

from shared.explain import Why
from shared.ids import ServerId

# The start of a TenantCells message that marks a running opportunistic job
# stopped by its cells' owner: receipts derive the CellReclaim rule from it.
RECLAIMED = "reclaimed"


def held_why(note: str = "") -> Why:
    """A user holds the job (``hops hold``); ``note`` is what they said."""
    return Why(code="Held", message="held by a user" + (f": {note}" if note else ""))


def unschedulable_why(message: str) -> Why:
    """No alive node has a GPU type the job runs on; ``message`` says which."""
    return Why(code="Unschedulable", message=message)


def drained_why(servers: Collection[ServerId]) -> Why:
    """The only nodes that could take the job (``servers``) are drained."""
    names = ", ".join(sorted(servers))
    return Why(code="NodeDrained",
               message=f"it fits only on drained nodes ({names})" if names
               else "it fits only on drained nodes")


def quota_why(layer: str, tenant: str, gpu_type: str, quota: int, used: int,
              gpus: int) -> Why:
    """A quota layer holds the job back: ``gpus`` more of ``gpu_type`` would
    take ``tenant`` past its ``quota`` (``used`` in use)."""
    return Why(code="Quota", layer=layer, gpu_type=gpu_type,
               short=max(0, used + gpus - quota),
               message=f"tenant {tenant} may use {quota} {gpu_type} GPUs and uses {used}; "
                       f"it needs {gpus}")


def cells_why(layer: str, message: str, gpu_type: str = "", short: int = 0) -> Why:
    """HiveD: the tenant's virtual cluster has no free cell that fits
    (``short``: GPUs its smallest size lacks in the largest free cell)."""
    return Why(code="TenantCells", layer=layer, message=message, gpu_type=gpu_type,
               short=short)


def reclaimed_why(layer: str) -> Why:
    """HiveD: a guaranteed job of the cells' owner reclaimed the cells this
    opportunistic job ran in (§3.3, strict priority)."""
    return cells_why(layer, f"{RECLAIMED} by a guaranteed job of the cells' owner")


def is_reclaim(why: Why) -> bool:
    """Whether a layer's reason says the job's cells were reclaimed."""
    return why.code == "TenantCells" and why.message.startswith(RECLAIMED)


def cores_why(layer: str, message: str, short: int = 0) -> Why:
    """A core layer (CODA): the CPU cores the job needs are not free
    (``short``: cores missing on the best server)."""
    return Why(code="Cores", layer=layer, message=message, short=short)
