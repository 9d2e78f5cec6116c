"""Leader election on every scheduler replica: the lease in KV
``hops_leader`` (:mod:`scheduling.live.lease` decides, this shell reads and
writes it). While the replica holds the lease it runs the leader
(:class:`services.scheduler.leader.Leader`); when the lease is lost it goes
back to admission only, and on SIGTERM it deletes the lease so that a
standby takes over without waiting for the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Sequence

import nats.errors
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from scheduling.layers.base import Layer
from scheduling.live.lease import (
    LEASE_KEY,
    Change,
    Create,
    Lease,
    Observed,
    Wait,
    encode_value,
    lease_stall,
)
from services.runtime.layout import JetStreamLayout
from services.runtime.retry import kv_write
from services.runtime.service import ServiceContext
from services.scheduler.leader import Leader
from services.scheduler.settings import SchedulerSettings
from shared import events as ev
from shared import subjects


class Elector:
    """Runs the lease (:class:`scheduling.live.lease.Lease`) and the leader's work
    while it lasts."""

    def __init__(
        self, ctx: ServiceContext, settings: SchedulerSettings, layers: Sequence[Layer] = ()
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self.layers = tuple(layers)
        # The lease's TTL is the leader bucket's (JetStreamLayout.of), one rule.
        self.lease = Lease(settings.replica(socket.gethostname(), os.getpid()),
                           JetStreamLayout.of(ctx.settings, ctx.name).leader_ttl,
                           lease_stall(ctx.settings.nats_replicas > 1))
        self.task: asyncio.Task[None] | None = None
        self.leader: Leader | None = None  # this term's, while it leads

    async def run(self) -> None:
        self.kv = await self.ctx.js.key_value(subjects.KV_LEADER)
        try:
            while not self.ctx.stopping.is_set():
                await self._tick(self.kv)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ctx.stopping.wait(), self.lease.interval)
        finally:
            await self._follow()
            await self._release()

    async def _release(self) -> None:
        """Step down and delete the lease, so a standby takes over at once."""
        term, revision = self.lease.term, self.lease.release()
        if revision is not None:
            with contextlib.suppress(Exception):
                await self.kv.delete(LEASE_KEY, last=revision)
            self.ctx.log.info("leadership released", term=term)

    async def _tick(self, kv: KeyValue) -> None:
        await self._change(self.lease.check(time.time()))
        observed: Observed | None = None
        if self.lease.role == "follower":
            try:
                entry = await kv.get(LEASE_KEY)
                observed = Observed.of(entry.value or b"", entry.revision or 0)
            except KeyNotFoundError:
                observed = None
            except (nats.errors.Error, TimeoutError) as e:
                self.ctx.log.warning("cannot read the lease", error=repr(e))
                return
        action = self.lease.action(time.time(), observed)
        if isinstance(action, Wait):
            return
        try:
            data = encode_value(action.value)
            if isinstance(action, Create):
                revision = await kv.create(LEASE_KEY, data)
            else:  # retried through an election, until the lease's horizon
                revision = await kv_write(
                    self.ctx.js, subjects.KV_LEADER, LEASE_KEY, data, last=action.revision,
                    msg_id=f"{self.lease.holder}:{action.revision}",
                    within=self.lease.write_budget(time.time()))
        except (nats.errors.Error, TimeoutError) as e:
            conflict = isinstance(e, KeyWrongLastSequenceError)
            if not conflict or self.lease.role == "leader":
                self.ctx.log.warning("lease write failed", error=repr(e))
            await self._change(self.lease.failed(conflict))
            return
        await self._change(self.lease.written(action, revision, time.time()))

    async def _change(self, change: Change) -> None:
        if change == "elected":
            self.ctx.log.info("elected leader", term=self.lease.term)
            leader = self.leader = Leader(self.ctx, self.settings, self.lease, self.layers)
            self.task = asyncio.create_task(self._lead(leader), name="leader")
        elif change == "deposed":
            self.ctx.log.warning("no longer leader", term=self.lease.term)
            await self._follow()

    async def _lead(self, leader: Leader) -> None:
        try:
            await leader.run()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # step down; a fresh term rebuilds the state
            self.ctx.log.exception("leader failed; stepping down")
            await self.ctx.reporter.report("scheduler.leader", repr(e), ev.INTERNAL)
            self.task = None
            await self._release()

    def use(self, settings: SchedulerSettings) -> None:
        """A reloaded tenants file: this term's leader and the next ones use it."""
        self.settings = settings
        if self.leader is not None:
            self.leader.use(settings)

    async def _follow(self) -> None:
        self.leader = None
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
