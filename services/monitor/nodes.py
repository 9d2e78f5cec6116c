"""Node registration (pure): who may join the cluster, and the records the
monitor keeps in ``hops_nodes``.

A node registers its :class:`~shared.cluster.Server`, the
:class:`~shared.cluster.GpuTypeSpec` of its GPU type and its adjacency
``order``. The message itself checks that ``server.gpu_type`` names the
type it describes and that the server has GPUs (§3.4's configurations
need both). Here: a server id registered again must describe the same
server, type and order (an executor restarting; cores or memory registered
as 0 may be given a value), and every node of one GPU
type must agree on that type's bandwidths (Eq. 2 reads one value per type);
anything else is a ``conflict``.

A registered node's record carries its ``last_heartbeat``, rewritten at
most once per ``write_s`` (:func:`heartbeat_due`): every beat would be
one KV write per node per second, while the monitor's verdict, ``alive``,
is written at once when it changes. An operator removes a node with
``remove_node`` (:func:`removal_refused`): a lost node at once, an alive
one only when forced, as Slurm refuses to delete a node that is in use.
``drain_node`` (:func:`drained`) marks it drained or not; registering again
keeps the mark.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.events import RegisterNode
from shared.ids import ServerId
from shared.records import NodeRecord

CONFLICT = "conflict"
NOT_FOUND = "not_found"
_LEARNED = frozenset({"cores", "memory_gb"})  # may go from 0 to a value


class Refusal(ValueError):
    """A registration the monitor refuses; ``code`` goes into the reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def admit(nodes: Mapping[ServerId, NodeRecord], req: RegisterNode, now: float) -> NodeRecord:
    """The record of the registering node, alive; :class:`Refusal` when it
    contradicts what is registered."""
    sid = req.server.id
    old = nodes.get(sid)
    if old is not None:
        differs = _differences(old, req)
        if differs:
            raise Refusal(CONFLICT, f"server {sid} is already registered with another "
                                    f"{', '.join(differs)}; refusing the new registration")
    for other in nodes.values():
        if other.server.id != sid and other.gpu_type.name == req.gpu_type.name \
                and other.gpu_type != req.gpu_type:
            raise Refusal(CONFLICT, f"GPU type {req.gpu_type.name} is registered by "
                                    f"{other.server.id} with {_bandwidths(other)}; "
                                    f"{sid} says {msgspec.structs.asdict(req.gpu_type)}")
    registered = old.registered_at if old is not None else now
    return NodeRecord(server=req.server, gpu_type=req.gpu_type, order=req.order,
                      registered_at=registered, last_heartbeat=now, alive=True,
                      address=req.address, devices=req.devices, models=req.models,
                      # an executor restarting does not undo an operator's drain
                      drained=old is not None and old.drained,
                      drain_move=old is not None and old.drain_move)


def revived(record: NodeRecord, now: float, bandwidth_gbps: float | None = None) -> NodeRecord:
    """``record`` alive again after a heartbeat (with the memory bandwidth
    in use it reported, when given)."""
    bandwidth = record.memory_bandwidth_gbps if bandwidth_gbps is None else bandwidth_gbps
    return msgspec.structs.replace(record, alive=True, last_heartbeat=now,
                                   memory_bandwidth_gbps=bandwidth)


def lost(record: NodeRecord, last_seen: float) -> NodeRecord:
    """``record`` after its heartbeat deadline passed."""
    return msgspec.structs.replace(record, alive=False, last_heartbeat=last_seen)


def heartbeat_due(record: NodeRecord, now: float, write_s: float) -> bool:
    """Whether a heartbeat at ``now`` is to be written to the record: at most
    one write per ``write_s`` per node."""
    return now - record.last_heartbeat >= write_s


def removal_refused(sid: ServerId, record: NodeRecord | None, force: bool,
                    now: float) -> Refusal | None:
    """Why ``sid`` may not be removed (``not_found``; ``conflict`` for an alive
    node without ``force``), or None."""
    if record is None:
        return Refusal(NOT_FOUND, f"no node {sid} is registered")
    if record.alive and not force:
        ago = max(0.0, now - record.last_heartbeat)
        return Refusal(CONFLICT, f"node {sid} is alive (last heartbeat {ago:.0f} s ago); stop "
                                 "its executor first, or force the removal (its jobs are "
                                 "requeued)")
    return None


def drained(sid: ServerId, record: NodeRecord | None, drain: bool, move: bool) -> NodeRecord:
    """``record`` drained (``move``: its jobs to be moved) or undrained;
    :class:`Refusal` (``not_found``) when ``sid`` is not registered."""
    if record is None:
        raise Refusal(NOT_FOUND, f"no node {sid} is registered")
    return msgspec.structs.replace(record, drained=drain, drain_move=drain and move)


def _bandwidths(rec: NodeRecord) -> dict[str, object]:
    return msgspec.structs.asdict(rec.gpu_type)


def _differences(old: NodeRecord, req: RegisterNode) -> list[str]:
    """What a re-registration changes, in words. Cores or memory a server
    registered as 0 (none scheduled: no job holds any) may be declared now,
    as an executor that learned its host's does after an upgrade."""
    out = [
        f"{name} ({getattr(old.server, name)!r}, now {getattr(req.server, name)!r})"
        for name in req.server.__struct_fields__
        if getattr(old.server, name) != getattr(req.server, name)
        and not (name in _LEARNED and getattr(old.server, name) == 0)
    ]
    if old.gpu_type != req.gpu_type:
        out.append("GPU type spec")
    if old.order != req.order:
        out.append(f"order ({old.order}, now {req.order})")
    return out
