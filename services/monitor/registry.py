"""The monitor's side of KV ``hops_nodes``: registration, heartbeat times,
lost and revived nodes, and removal and drain by an operator.

The decisions are :mod:`services.monitor.nodes`'; this shell keeps the
records in memory, feeds node deadlines to the :class:`DeadlineTracker`
and writes every change to ``hops_nodes`` (the monitor is its only
writer). A node's ``last_heartbeat`` is written at most once per
``write_s`` (see :func:`services.monitor.nodes.heartbeat_due`); ``alive``
is written as soon as it changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
from nats.js.kv import KeyValue

from services.monitor.deadlines import DeadlineTracker
from services.monitor.nodes import (
    Refusal,
    admit,
    drained,
    heartbeat_due,
    lost,
    removal_refused,
    revived,
)
from services.runtime.bus import Rejected
from services.runtime.kv import read_bucket
from services.runtime.retry import kv_write
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import INVALID, DrainNode, NodeHeartbeat, RegisterNode, RemoveNode
from shared.ids import ServerId
from shared.records import NodeRecord


class NodeRegistry:
    """Registered nodes, in memory and in ``hops_nodes``."""

    def __init__(self, ctx: ServiceContext, kv: KeyValue, tracker: DeadlineTracker,
                 write_s: float, unknown_report_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.ctx = ctx
        self.kv = kv
        self.tracker = tracker
        self.write_s = write_s
        self.unknown_report_s = unknown_report_s
        self.clock = clock
        self.log = ctx.log
        self.nodes: dict[ServerId, NodeRecord] = {}
        self._unknown_reported: dict[str, float] = {}

    async def load(self) -> None:
        now = self.clock()
        # read_bucket, not keys(): nats-py's keys() may read a bucket with keys
        # as empty on a busy host, and the nodes would be strangers till they
        # registered again.
        for key, value in (await read_bucket(self.ctx.js, subjects.KV_NODES)).items():
            try:
                rec = msgspec.json.decode(value.data, type=NodeRecord)
            except msgspec.DecodeError as e:
                await self.ctx.reporter.report(f"kv.{subjects.KV_NODES}.{key}", str(e), INVALID,
                                               value.data)
                continue
            self.nodes[rec.server.id] = rec
            if rec.alive:  # a fresh deadline: the monitor was away, not the node
                self.tracker.watch_node(rec.server.id, now)

    async def register(self, req: RegisterNode, subject: str) -> None:
        """Admit the node (:class:`Rejected` when it contradicts what is registered)."""
        now = self.clock()
        sid = req.server.id
        try:
            record = admit(self.nodes, req, now)
        except Refusal as e:
            await self.ctx.reporter.report(subject, str(e), e.code)
            raise Rejected(e.code, str(e)) from None
        await self._put(record)
        self.tracker.watch_node(sid, now)
        self.log.info("node registered", server_id=sid, gpus=req.server.gpus,
                      gpu_type=req.server.gpu_type, order=req.order)

    async def beat(self, beat: NodeHeartbeat, subject: str, data: bytes) -> bool:
        """Record a node heartbeat; False for a node that is not registered
        (reported at most once per ``unknown_report_s`` per server)."""
        sid = beat.server_id
        record = self.nodes.get(sid)
        now = self.clock()
        if record is None:
            if now - self._unknown_reported.get(sid, -1e18) >= self.unknown_report_s:
                self._unknown_reported[sid] = now
                await self.ctx.reporter.report(subject, f"heartbeat from server {sid}, which "
                                               "is not registered (never, or removed)",
                                               "not_found", data)
            return False
        if not self.tracker.node_beat(sid, now, beat.running):
            self.tracker.watch_node(sid, now)
            self.tracker.node_beat(sid, now, beat.running)
            await self._put(revived(record, now, beat.memory_bandwidth_gbps))
            self.log.warning("node is back", server_id=sid)
        elif heartbeat_due(record, now, self.write_s):
            await self._put(revived(record, now, beat.memory_bandwidth_gbps))
        return True

    async def mark_lost(self, sid: ServerId, last: float) -> None:
        record = self.nodes.get(sid)
        if record is not None:
            await self._put(lost(record, last))

    async def remove(self, req: RemoveNode) -> NodeRecord:
        """Remove the node (:class:`Rejected` when it may not be); its record
        as it was. It is forgotten before any await, so no heartbeat or
        verdict writes it back; registering again brings it back."""
        sid = req.server_id
        record = self.nodes.get(sid)
        refusal = removal_refused(sid, record, req.force, self.clock())
        if refusal is not None:
            raise Rejected(refusal.code, str(refusal))
        assert record is not None  # removal_refused says not_found otherwise
        del self.nodes[sid]
        self.tracker.forget_node(sid)
        await self.kv.delete(sid)
        self.log.warning("node removed", server_id=sid, was_alive=record.alive,
                         forced=req.force, reason=req.reason)
        return record

    async def drain(self, req: DrainNode) -> NodeRecord:
        """Drain or undrain the node (:class:`Rejected` ``not_found`` for an
        unknown one); its record as it now is, written to ``hops_nodes``,
        where the leader reads it (and a restarted monitor)."""
        sid = req.server_id
        try:
            record = drained(sid, self.nodes.get(sid), req.drain, req.move)
        except Refusal as e:
            raise Rejected(e.code, str(e)) from None
        await self._put(record)
        self.log.warning("node drained" if req.drain else "node undrained", server_id=sid,
                         move=record.drain_move, reason=req.reason)
        return record

    async def _put(self, record: NodeRecord) -> None:
        """Keep ``record`` (before the await: a verdict on the node reads it)."""
        self.nodes[record.server.id] = record
        # retried through a leader election of the bucket (a NATS cluster)
        await kv_write(self.ctx.js, subjects.KV_NODES, record.server.id,
                       msgspec.json.encode(record))
