"""The leader's layer state and tenant views in KV (HiveD §4 "Fault tolerance").

A stateful layer (HiveD's: its cell bindings) returns its state after each
plan in its ``LayerRecord.state``. The leader keeps the last state of each
layer and puts it in every snapshot it builds (``Snapshot.layer_state``), and
writes each state to KV ``hops_layers`` (key: the layer's name) as it
publishes the plan (in compressed parts when it is larger than one message,
:func:`services.runtime.kv.pack`): just before, so that a leader that dies in between
leaves a state with cells for jobs that never start (the layer's reconcile
releases them at the next plan), never a state that lacks the cells of jobs
that did start (their next plan could move them). A standby that takes the
lease reads the bucket before its first plan, so the layer restores the
same bindings: the state is canonical (:mod:`scheduling.cells.report`), and
so are the decisions after it.

With the tenants' cells, the leader also writes each tenant's virtual
cluster (:class:`scheduling.live.cells.TenantRecord`) to KV ``hops_tenants``
(key: the tenant) after each plan and when it takes the lease; the gateway
answers ``GET /tenants`` from there, so the view outlives any one leader.
When the registered nodes change it checks the cells against them again and
reports a mismatch (an executor with other GPUs than its cell) on
``hops.v1.errors``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import nats.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from scheduling.cells import TenantView
from scheduling.live import cells as lc
from scheduling.live.forecasting import tenant_servers
from scheduling.policy import Policy
from scheduling.registry import make_policy, policy_traits
from services.runtime.kv import is_part, pack, parts_of, read_bucket, unpack
from services.runtime.service import ServiceContext
from services.scheduler.settings import SchedulerSettings
from shared import events as ev
from shared import subjects
from shared.ids import ServerId, TenantId
from shared.records import NodeRecord
from shared.snapshot import LayerRecord
from shared.tenants import TenantsError


def build_policy(settings: SchedulerSettings) -> Policy:
    """The configured policy, built with the tenants' cells when its traits
    say it needs them."""
    spec, cells = settings.policy, settings.cells
    if cells is None or not policy_traits(spec).needs_cells:
        return make_policy(spec)
    return make_policy(spec, cells=cells)


class LayerStore:
    """``hops_layers`` and ``hops_tenants`` for one leader term."""

    def __init__(self, ctx: ServiceContext, settings: SchedulerSettings, term: int,
                 leader: str) -> None:
        self.ctx, self.settings, self.term, self.leader = ctx, settings, term, leader
        self.log = ctx.log.bind(term=term)
        self.state: dict[str, bytes] = {}
        self._parts: dict[str, list[str]] = {}  # the part keys each layer's head names
        self._problem: str | None = None  # the last cells-vs-nodes error reported
        self._checked: object = None  # the nodes it was checked against
        self._shown: dict[str, TenantView] = {}  # the views this term wrote
        self.traits = policy_traits(settings.policy)

    async def open(self, js: JetStreamContext) -> None:
        self.kv_layers: KeyValue = await js.key_value(subjects.KV_LAYERS)
        self.kv_tenants: KeyValue = await js.key_value(subjects.KV_TENANTS)

    async def load(self) -> dict[str, bytes]:
        """Every layer's state as the last leader left it."""
        values = await read_bucket(self.ctx.js, subjects.KV_LAYERS)
        raw = {k: v.data for k, v in values.items() if v.data}
        self.state = {}
        for key in sorted(k for k in raw if not is_part(k)):
            self._parts[key] = parts_of(key, raw[key])
            try:
                self.state[key] = unpack(key, raw)
            except ValueError as e:  # the layer starts afresh, as from no state
                self.log.error("layer state unreadable", layer=key, error=str(e))
        self.log.info("layer state loaded", layers=sorted(self.state))
        return self.state

    async def save(self, records: Iterable[LayerRecord]) -> None:
        """Keep and write the state each layer returned (with a plan to publish)."""
        for record in records:
            if not record.state or self.state.get(record.name) == record.state:
                continue
            self.state[record.name] = record.state
            pairs = pack(record.name, record.state)
            for key, value in pairs:
                await self.kv_layers.put(key, value)
            old = set(self._parts.get(record.name, ())) - {k for k, _ in pairs}
            self._parts[record.name] = parts_of(record.name, pairs[-1][1])
            for key in sorted(old):  # parts of the replaced head: garbage from now on
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await self.kv_layers.delete(key)

    async def publish_views(self, now: float, nodes: Iterable[NodeRecord]) -> None:
        """Write each tenant's view of the cells, as the policy's traits read
        them from its layers' state, with the cell servers that are not alive
        bad; while no node is alive nothing is planned, and the state is
        shown as it is (a cluster starting)."""
        model = self.settings.cells
        if model is None:
            return
        alive = {n.server.id for n in nodes if n.alive}
        views = [v for v in self.traits.tenant_views(model, self.state, alive or None)
                 if self._shown.get(v.tenant) != v]  # unchanged: not written again
        for view in views:
            data = lc.tenant_records([view], now, self.term, self.leader)[view.tenant]
            try:
                await self.kv_tenants.put(view.tenant, data)
                self._shown[view.tenant] = view
            except (nats.errors.Error, TimeoutError) as e:  # a view, not a plan: next time
                self.log.warning("tenant view not written", tenant=view.tenant, error=repr(e))

    async def check_nodes(self, nodes: Iterable[NodeRecord]) -> None:
        """Check the cells against the registered nodes; report a new mismatch once."""
        nodes = sorted(nodes, key=lambda n: n.server.id)
        key = [(n.server, n.gpu_type) for n in nodes]
        if self.settings.cells is None or key == self._checked:
            return
        self._checked = key
        problem = None
        try:
            lc.tenant_cells(self.settings.tenants, nodes, self.settings.tenants_source)
        except TenantsError as e:
            problem = str(e)
        if problem is not None and problem != self._problem:
            self.log.error("the tenants' cells do not match the registered nodes",
                           error=problem)
            with contextlib.suppress(Exception):
                await self.ctx.reporter.report("scheduler.cells", problem, ev.INVALID)
        self._problem = problem

    def tenant_servers(self) -> dict[TenantId, frozenset[ServerId]] | None:
        """Each tenant's servers by the views this term wrote (the forecast's
        ``tenant_cells``, :func:`scheduling.live.forecasting.tenant_servers`);
        None without the tenants' cells."""
        if self.settings.cells is None:
            return None
        return tenant_servers(self._shown.values())

    def snapshot_state(self) -> dict[str, bytes]:
        """What the next snapshot carries (``Snapshot.layer_state``)."""
        return dict(self.state)
