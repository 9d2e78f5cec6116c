"""HiveD as a layer of the policy stack (Zhao et al., OSDI'20, §3.1 Figure 2:
a two-layer design with any scheduler inside each virtual cluster).

Per tenant (``JobSpec.tenant``) the inner policy plans the tenant's jobs on
the tenant's virtual cluster (:mod:`.view`) as if it were the whole
cluster. Each assignment is then bound to physical GPUs by buddy cell
allocation (Algorithm 1) through :meth:`scheduling.cells.Cells.allocate`;
a job whose virtual configuration is unchanged keeps its cells, a resized
or moved one releases them and allocates again. Jobs beyond what their
tenant's cells hold now, and every job of a low-priority tenant, may run
opportunistically on idle GPUs of any tenant (setting ``opportunistic``),
shared by weighted max-min (:mod:`.opportunistic`). A guaranteed job
whose cell holds opportunistic jobs preempts them (§3.3: strict priority),
but only in a round's first plan: a plan later in the round only adds
(Hops §3.6), so the guaranteed job waits for the next first plan (a
departure: HiveD preempts at once).

The layer is stateful: its cell bindings and each job's virtual
configuration travel as ``LayerRecord.state`` and come back as
``Snapshot.layer_state["hived"]`` (§4 "Fault tolerance": a standby rebuilds
the same bindings). Each plan restores that state, reconciles it with the
snapshot (a job that ended, or that the mechanism did not start, gives its
cells back), keeps the snapshot's physical holds (profiling runs) out of the
cells for this plan, plans, and returns the new state: one plan's steps are
:class:`.round.HivedRound`. This module holds the layer itself: its
settings, its traits for the mechanism, the tenants' views, the restored
state and each tenant's virtual cluster, cached by the cluster's GPU types.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from scheduling.cells import CellModel, Cells, TenantView, VirtualSlot
from scheduling.layers.hived.round import HivedRound
from scheduling.layers.hived.state import cells_of_state, decode_state, restore_cells
from scheduling.layers.hived.view import virtual_cluster, virtual_servers
from scheduling.layers.profiling_first import ProfilingSettings
from scheduling.layers.traits import PolicyTraits, TenantAdmission, marked_views
from scheduling.policy import Policy
from shared.cluster import Cluster, GpuTypeSpec
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import R_NUM
from shared.snapshot import Plan, Snapshot

Slots = dict[tuple[GpuType, VirtualSlot], ServerId]


class HivedLayer:
    """Virtual clusters and buddy cell allocation around any inner policy."""

    name = "hived"

    def __init__(self, model: CellModel, opportunistic: bool = True, r_num: int = R_NUM,
                 profiling: ProfilingSettings | None = None) -> None:
        self.model = model
        self.profiling = profiling or ProfilingSettings()  # for jobs profiled outside the cells
        self.opportunistic = opportunistic
        self.r_num = r_num
        self._vcs: dict[tuple[str, tuple[GpuTypeSpec, ...]], Cluster | None] = {}
        self._slots: dict[tuple[str, tuple[GpuTypeSpec, ...]], Slots] = {}
        self._by_sid: dict[tuple[str, tuple[GpuTypeSpec, ...]], dict[ServerId, VirtualSlot]] = {}
        self._last: tuple[bytes, Cells, dict[JobId, Configuration]] | None = None

    @classmethod
    def traits(cls, opportunistic: bool) -> PolicyTraits:
        """Built with the cells; a job beyond its tenant's cells runs only
        ``opportunistic``ally; the views are the layer's cells."""
        return PolicyTraits(needs_cells=True, admission=TenantAdmission(beyond=opportunistic),
                            views=cls.tenant_views)

    @classmethod
    def tenant_views(cls, model: CellModel, layer_state: Mapping[str, bytes],
                     alive: Collection[ServerId] | None = None) -> tuple[TenantView, ...]:
        """Every tenant's VC view (§3.1, Figure 2) in the state this layer
        left (fresh when there is none, or when it does not fit ``model``:
        the layer then starts afresh as well)."""
        return marked_views(cells_of_state(model, layer_state.get(cls.name)), alive)

    def restore(self, snapshot: Snapshot) -> tuple[Cells, dict[JobId, Configuration]]:
        """The state the previous plan left (fresh when there is none). The
        object of the last plan is reused when the snapshot carries exactly
        its state; restoring gives the same state and decisions either way."""
        raw = snapshot.layer_state.get(self.name, b"")
        if self._last is not None and raw and raw == self._last[0]:
            return self._last[1], dict(self._last[2])
        if not raw:
            return Cells(self.model), {}
        state = decode_state(raw)
        return restore_cells(self.model, raw), {JobId(k): v for k, v in state.virtual.items()}

    def vc(self, tenant: str, cluster: Cluster) -> Cluster | None:
        key = (tenant, cluster.gpu_types)
        if key not in self._vcs:
            if len(self._vcs) > 256:
                self._vcs.clear()
                self._slots.clear()
                self._by_sid.clear()
            self._vcs[key] = virtual_cluster(self.model, tenant, cluster)
            servers = virtual_servers(self.model, tenant, cluster)
            self._slots[key] = {(g, slot): sid for sid, g, slot, _ in servers}
            self._by_sid[key] = {sid: slot for sid, _, slot, _ in servers}
        return self._vcs[key]

    def slots(self, tenant: str, cluster: Cluster) -> Slots:
        """Virtual server by (GPU type, virtual cell) for the tenant's VC."""
        self.vc(tenant, cluster)
        return self._slots[(tenant, cluster.gpu_types)]

    def slot_of(self, tenant: str, cluster: Cluster, sid: ServerId) -> VirtualSlot:
        """The virtual cell (and node) a virtual server of the tenant stands for."""
        self.vc(tenant, cluster)
        return self._by_sid[(tenant, cluster.gpu_types)][sid]

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        cells, virtual = self.restore(snapshot)
        self._last = None  # the object changes now: reusable only once this plan is made
        plan, state = HivedRound(self, snapshot, inner, cells, virtual).run()
        self._last = (state, cells, dict(virtual))
        return plan


