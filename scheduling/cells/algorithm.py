"""The cell facade: what the policy layer, the simulator and the live
scheduler call (HiveD §3, Figure 2).

:class:`Cells` is buddy cell allocation (Algorithm 1) with virtual clusters
and dynamic binding over one cell model. It holds its state like a ledger:
``allocate``, ``release`` and ``set_health`` change it; every other method
reads it and returns a frozen value. The same calls in the same order give
the same state and the same decisions: iteration is sorted and every choice
has a canonical tie-break (:mod:`scheduling.cells.buddy`).
"""

from __future__ import annotations

from pathlib import Path

from scheduling.cells.ledger import Ledger
from scheduling.cells.opportunistic import idle
from scheduling.cells.report import restore_into, snapshot, tenant_view
from scheduling.cells.spec import CellModel, load_cells
from scheduling.cells.views import Allocation, Snapshot, TenantView
from shared.cluster import Cluster
from shared.ids import GpuType


class Cells(Ledger):
    """The facade; see :class:`Ledger` for allocate, release, set_health,
    preemption_victims, fits and check_safety."""

    @classmethod
    def load(cls, path: str | Path, cluster: Cluster) -> Cells:
        """Cells of the spec in ``path``, checked against ``cluster``."""
        return cls(load_cells(path, cluster))

    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted(self.model.low_priority))

    def view(self, tenant: str) -> TenantView:
        """The tenant's VC view: its cells, their bindings, its jobs."""
        return tenant_view(self, tenant)

    def views(self) -> tuple[TenantView, ...]:
        return tuple(self.view(t) for t in self.tenants())

    def snapshot(self) -> Snapshot:
        """The state as plain data (msgspec-encodable), canonical order."""
        return snapshot(self)

    @classmethod
    def restore(cls, model: CellModel, snap: Snapshot) -> Cells:
        """The state a snapshot was taken in, rebuilt from the spec."""
        cells = cls(model)
        restore_into(cells, snap)
        return cells

    def weights(self) -> dict[str, float]:
        """Each tenant's weight for the weighted max-min share of
        opportunistic capacity (§3.3), which the layer computes."""
        return dict(sorted(self.model.weights.items()))

    def allocations(self) -> tuple[Allocation, ...]:
        """Every job's placement, by job id."""
        return tuple(self.allocation(j) for j in sorted(self.jobs))

    def idle_gpus(self) -> dict[GpuType, int]:
        """Healthy GPUs no job uses, per GPU type: what opportunistic jobs
        may share (O(GPUs); once per round, not per request)."""
        out = {g: 0 for g in sorted(self.model.chains)}
        for (gpu, level), cells in self.tree.at_level.items():
            if level == 1:
                out[gpu] += sum(1 for c in cells if idle(self.tree, self.buddy, c))
        return out

    def opportunistic_gpus(self) -> dict[str, int]:
        """GPUs each tenant's opportunistic jobs use now."""
        out = {t: 0 for t in self.tenants()}
        for job in self.jobs.values():
            if job.opportunistic:
                out[job.tenant] += job.gpus
        return out
