"""The leader's layer state and tenant views (HiveD §4 "Fault tolerance").

A stateful layer (HiveD's: its cell bindings) returns its state after each
plan in its ``LayerRecord.state``. The leader keeps the last state of each
layer and puts it in every snapshot it builds (``Snapshot.layer_state``), and
writes each state to the object store ``hops_state`` (object
``layer.<name>``, compressed, :func:`services.runtime.objects.put_object`)
as it publishes the plan: just before, so that a leader that dies in between
leaves a state with cells for jobs that never start (the layer's reconcile
releases them at the next plan), never a state that lacks the cells of jobs
that did start (their next plan could move them). A write is one object
version, seen whole or not at all. A standby that takes the lease reads the
objects before its first plan, so the layer restores the same bindings: the
state is canonical (:mod:`scheduling.cells.report`), and so are the
decisions after it. A layer with no object yet is read from where earlier
versions kept it, KV ``hops_layers`` in compressed parts
(:func:`services.runtime.kv.unpack`), so that a leader restarted on an
older data directory keeps its bindings; its first write moves it.

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
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from scheduling.cells import TenantView
from scheduling.live import cells as lc
from scheduling.live.forecasting import tenant_servers
from scheduling.policy import Policy
from scheduling.registry import make_policy, policy_traits
from services.runtime.kv import is_part, read_bucket, unpack
from services.runtime.objects import ObjectError, object_names, put_object, read_retried
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


LAYER = "layer."  # object name prefix in hops_state


class LayerStore:
    """The layers' state (``hops_state``) and ``hops_tenants`` for one leader term."""

    def __init__(self, ctx: ServiceContext, settings: SchedulerSettings, term: int,
                 leader: str) -> None:
        self.ctx, self.settings, self.term, self.leader = ctx, settings, term, leader
        self.log = ctx.log.bind(term=term)
        self.state: dict[str, bytes] = {}
        self._problem: str | None = None  # the last cells-vs-nodes error reported
        self._checked: object = None  # the nodes it was checked against
        self._shown: dict[str, TenantView] = {}  # the views this term wrote
        self.traits = policy_traits(settings.policy)

    async def open(self, js: JetStreamContext) -> None:
        self.kv_tenants: KeyValue = await js.key_value(subjects.KV_TENANTS)

    async def load(self) -> dict[str, bytes]:
        """Every layer's state as the last leader left it: its object, else
        its value in the KV bucket of earlier versions."""
        js = self.ctx.js
        names = [n[len(LAYER):] for n in await object_names(js, subjects.OBJ_STATE)
                 if n.startswith(LAYER)]
        self.state = await self._legacy()
        for name in names:
            try:
                data = await read_retried(js, subjects.OBJ_STATE, LAYER + name)
            except ObjectError as e:  # the layer starts afresh, as from no state
                self.log.error("layer state unreadable", layer=name, error=str(e))
                self.state.pop(name, None)
                continue
            if data is not None:
                self.state[name] = data
        self.log.info("layer state loaded", layers=sorted(self.state))
        return self.state

    async def _legacy(self) -> dict[str, bytes]:
        """The layers' state in KV ``hops_layers`` (earlier versions; none on
        a bus that never had the bucket)."""
        try:
            values = await read_bucket(self.ctx.js, subjects.KV_LAYERS)
        except NotFoundError:
            return {}
        raw = {k: v.data for k, v in values.items() if v.data}
        out = {}
        for key in sorted(k for k in raw if not is_part(k)):
            try:
                out[key] = unpack(key, raw)
            except ValueError as e:  # the layer starts afresh, as from no state
                self.log.error("layer state unreadable", layer=key, error=str(e))
        return out

    async def save(self, records: Iterable[LayerRecord]) -> None:
        """Keep and write the state each layer returned (with a plan to
        publish), each write retried through a JetStream leader election."""
        for record in records:
            if not record.state or self.state.get(record.name) == record.state:
                continue
            self.state[record.name] = record.state
            await put_object(self.ctx.js, subjects.OBJ_STATE, LAYER + record.name,
                             record.state)

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
