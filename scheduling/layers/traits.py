"""What the mechanism needs to know of a policy, answered by its layers.

The live scheduler, the simulator and the gateway never look at a policy's
name to decide what to do: each layer class answers for itself
(``HivedLayer.traits``, ``QuotaLayer.traits``, ``CoreLayer.traits``, class
methods that need the spec's settings only, no cells), and the registry
composes the answers of a spec's stack (:func:`combine`,
:func:`scheduling.registry.policy_traits`). The answers:

- ``needs_cells``: the policy is built with the tenants' cells, so
  admission loads them and refuses what no cell can hold;
- ``schedules_cores``: a core layer plans CPU cores, so CPU jobs may run;
- ``admission``: what a tenant's job may do beyond its reservation
  (:class:`TenantAdmission`);
- ``tenant_views``: the tenants' virtual clusters in the state the policy's
  layers left after a plan, read by the layer that wrote it (as HiveD's
  shell asks its ``SchedulerAlgorithm`` for a virtual cluster's status
  instead of decoding it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import msgspec

from scheduling.cells import CellModel, Cells, TenantView
from shared.ids import ServerId


class TenantAdmission(msgspec.Struct, frozen=True):
    """What a policy lets a tenant's job do beyond the tenant's reservation,
    for admission (a job that can never run is refused): ``beyond``, run
    there at all (HiveD's opportunistic jobs, Kueue's borrowing); ``quota``,
    the reservation counts GPUs per type (Kueue's nominal quota) rather
    than cells (HiveD)."""

    beyond: bool = True
    quota: bool = False


# The tenants' views in a plan's layer state (``Snapshot.layer_state``, by
# layer name); with ``alive``, a cell server not in it is shown bad.
TenantViews = Callable[
    [CellModel, Mapping[str, bytes], Collection[ServerId] | None], tuple[TenantView, ...]]


@dataclass(frozen=True)
class PolicyTraits:
    """A policy's answers to the mechanism (see the module docstring).
    ``policy`` is the name messages show; nothing compares it."""

    policy: str = ""
    needs_cells: bool = False
    schedules_cores: bool = False
    admission: TenantAdmission = field(default_factory=TenantAdmission)
    views: TenantViews | None = None
    # A task-level policy (Hare's, docs/hare.md §7): the leader sequences
    # tasks, and each relaxed job's gradients go to an aggregator service.
    sequences_tasks: bool = False

    def tenant_views(self, model: CellModel, layer_state: Mapping[str, bytes],
                     alive: Collection[ServerId] | None = None) -> tuple[TenantView, ...]:
        """Every tenant's virtual cluster after the plan that left
        ``layer_state``; a policy whose layers bind no cells shows the
        cells as the model declares them, nothing bound."""
        if self.views is None:
            return marked_views(Cells(model), alive)
        return self.views(model, layer_state, alive)


def combine(policy: str, *traits: PolicyTraits) -> PolicyTraits:
    """The traits of a stack from its layers' (any order): a stack needs
    the cells, or schedules cores, when one of its layers does; admission
    and the views are the cell layer's."""
    cells = [t for t in traits if t.needs_cells]
    return PolicyTraits(
        policy=policy,
        needs_cells=bool(cells),
        schedules_cores=any(t.schedules_cores for t in traits),
        admission=cells[0].admission if cells else TenantAdmission(),
        views=next((t.views for t in traits if t.views is not None), None),
    )


def marked_views(cells: Cells, alive: Collection[ServerId] | None) -> tuple[TenantView, ...]:
    """``cells``' views with every cell server not in ``alive`` bad, as a
    cell layer marks it at its next plan (HiveD §4 "Handling faulty
    hardware"), so a dead node's doomed cells show before the next plan."""
    if alive is not None:
        for server in sorted(cells.tree.node_of):
            cells.set_health(server, server in alive)
    return cells.views()
