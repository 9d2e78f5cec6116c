"""The tenants' cells in the live system: the decisions, without I/O.

The tenants file (:mod:`shared.tenants`) carries HiveD's cell specification
in its ``cells`` section (§4 "Cell specification", Figure 4, in the
vocabulary of :mod:`scheduling.cells.spec`). This module turns it into a
:class:`~scheduling.cells.CellModel` and answers what admission and the
leader ask of it:

- :func:`tenant_cells` checks the section against the cluster the scheduler
  knows, the registered nodes (alive or not). A node-level cell whose server
  has not registered yet is taken as the cells say (its GPU type is its
  chain's, its GPUs the leaves of its cell), so a scheduler that starts
  before its executors checks everything but those servers, and a server
  that registers with other GPUs is an error naming the file and the cell;
- :func:`cells_refusal` is admission's answer to microsoft/pai#4029 (cell
  size silently capped job size): a job whose smallest requirement fits no
  cell of its tenant (:meth:`Cells.fits`; under a quota policy, exceeds
  its tenant's quota of every GPU type) and that cannot run beyond its
  tenant's reservation (the policy's :class:`TenantAdmission`: ``hived``
  with ``opportunistic`` off, ``quota``) is refused ``unschedulable``
  (HTTP 422), saying which cells or quota the tenant has;
- :class:`TenantRecord` is what the leader writes for each tenant in KV
  ``hops_tenants`` (GET /tenants, ``hops tenants``: the VC -> node view
  users of HiveD asked for, microsoft/pai#4932), the views the policy's
  traits read out of the state its cell layer left after a plan
  (:meth:`scheduling.layers.traits.PolicyTraits.tenant_views`).

Whether a policy is built with the cells at all, and what it lets a tenant's
job do beyond its cells, the policy's traits say
(:func:`scheduling.registry.policy_traits`), never its name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from scheduling.cells import CellModel, Cells, TenantView, cells_from_doc
from scheduling.layers.quota import quotas_of
from scheduling.layers.traits import TenantAdmission
from scheduling.live.admission import Refusal
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.specs import SpecError
from shared.tenants import TenantsError, TenantsFile
from shared.wire import UNSCHEDULABLE

# GPU bandwidths of a GPU type no registered node has yet: only the cells'
# validation sees them (the planner plans on registered nodes).
_PLACEHOLDER_BANDWIDTH = 1.0


def _node_cells(doc: Mapping[str, Any]) -> dict[ServerId, str]:
    """Each server a node-level physical cell names, with its cell type
    (given, or its parent's ``child_cell_type``); a malformed document
    yields what it can, :func:`cells_from_doc` says what is wrong."""
    types = doc.get("cell_types")
    types = types if isinstance(types, dict) else {}
    out: dict[ServerId, str] = {}

    def walk(cell: Any, expected: str | None, depth: int) -> None:
        if not isinstance(cell, dict) or depth > len(types) + 1:
            return
        ctype = cell.get("cell_type") or expected
        if not isinstance(ctype, str):
            return
        server = cell.get("server")
        if isinstance(server, str) and server:
            out[ServerId(server)] = ctype
        spec = types.get(ctype)
        children = cell.get("children")
        if isinstance(spec, dict) and isinstance(children, list):
            for child in children:
                walk(child, spec.get("child_cell_type"), depth + 1)

    cells = doc.get("physical_cells")
    for top in cells if isinstance(cells, list) else ():
        walk(top, None, 0)
    return out


def _leaf_of(doc: Mapping[str, Any], ctype: str) -> tuple[str, int] | None:
    """The GPU type below cell type ``ctype`` and how many of it a cell
    holds; None when the chain is malformed (left to the spec's checks)."""
    types = doc.get("cell_types")
    types = types if isinstance(types, dict) else {}
    gpus, name, seen = 1, ctype, set()
    while name in types:
        spec = types[name]
        if name in seen or not isinstance(spec, dict):
            return None
        seen.add(name)
        number, child = spec.get("child_cell_number"), spec.get("child_cell_type")
        if not isinstance(number, int) or not isinstance(child, str) or number < 1:
            return None
        gpus, name = gpus * number, child
    return (name, gpus) if name != ctype else None


def declared_cluster(doc: Mapping[str, Any], nodes: Iterable[NodeRecord]) -> Cluster:
    """The registered nodes (alive or not), and each server the cells name
    that has not registered, as its cell says it is (see the module docstring)."""
    registered = {n.server.id: n for n in nodes}
    types: dict[GpuType, GpuTypeSpec] = {}
    servers = [n.server for _, n in sorted(registered.items())]
    for n in registered.values():
        types.setdefault(n.server.gpu_type, n.gpu_type)
    for sid, ctype in sorted(_node_cells(doc).items()):
        leaf = _leaf_of(doc, ctype)
        if sid in registered or leaf is None:
            continue
        gpu = GpuType(leaf[0])
        types.setdefault(gpu, GpuTypeSpec(gpu, _PLACEHOLDER_BANDWIDTH, _PLACEHOLDER_BANDWIDTH))
        servers.append(Server(sid, gpu, leaf[1]))
    return Cluster(gpu_types=tuple(types[g] for g in sorted(types)), servers=tuple(servers),
                   name="declared")


def cluster_nodes(cluster: Cluster) -> list[NodeRecord]:
    """A cluster spec's servers as registered nodes (``hops up`` and ``hops
    credentials`` check the cells against the cluster they launch)."""
    return [NodeRecord(server=s, gpu_type=cluster.type_by_name[s.gpu_type]) for s in
            cluster.servers]


def tenant_cells(tenants: TenantsFile, nodes: Iterable[NodeRecord] = (),
                 source: str = "tenants file") -> CellModel | None:
    """The cell model of the tenants file's ``cells`` section, checked
    against ``nodes``; None when it has none. :class:`TenantsError` naming
    ``source`` and the field, e.g. ``tenants.yaml: cells: physical_cells[0].
    server: server n0 has 4 GPUs, its cell has 8 leaf cells``."""
    doc = tenants.cells
    if doc is None:
        return None
    try:
        return cells_from_doc(doc, declared_cluster(doc, nodes), f"{source}: cells")
    except SpecError as e:
        raise TenantsError(str(e)) from None
    except (TypeError, ValueError) as e:  # a server the cluster itself refuses
        raise TenantsError(f"{source}: cells: {e}") from None


def _cells_text(model: CellModel, tenant: str) -> str:
    parts = []
    for gpu, counts in sorted(model.reservations.get(tenant, {}).items()):
        chain = model.chains[gpu]
        for level, n in enumerate(counts, start=1):
            if n:
                parts.append(f"{n} {chain.types[level - 1]} ({chain.sizes[level - 1]} {gpu})")
    return ", ".join(parts) or "none"


def cells_refusal(cells: Cells, spec: JobSpec, r_num: int,
                  rule: TenantAdmission) -> Refusal | None:
    """Why ``spec`` can never run under the tenants' cells, or None (see the
    module docstring); ``cells`` is any state of the model (only the model
    is read). A low-priority tenant runs only beyond its (empty) reservation."""
    model, tenant = cells.model, spec.tenant
    if tenant not in model.low_priority:
        return Refusal(UNSCHEDULABLE, f"job {spec.id}: tenant {tenant} has no virtual cluster "
                       "in the tenants file's cells")
    if rule.beyond or spec.kind == "cpu":  # the cells hold GPUs; a CPU job asks for none
        return None
    off = ("the policy does not borrow" if rule.quota
           else "the policy has opportunistic jobs off")
    smallest = spec.requirement_set(r_num)[0]
    if model.low_priority[tenant]:
        return Refusal(UNSCHEDULABLE, (
            f"job {spec.id} can never run here: tenant {tenant} is low-priority (it reserves "
            f"nothing and runs only beyond its reservation) and {off}"))
    if rule.quota:
        quota = quotas_of(model).get(tenant, {})
        if any(n >= smallest for n in quota.values()):
            return None
        held = ", ".join(f"{n} {g}" for g, n in sorted(quota.items())) or "none"
        return Refusal(UNSCHEDULABLE, (
            f"job {spec.id} can never run here: it needs at least {smallest} GPUs of one type, "
            f"more than tenant {tenant}'s quota ({held}), and {off}; ask for fewer GPUs or "
            "for a larger quota"))
    if any(cells.fits(tenant, gpu, smallest) for gpu in sorted(model.chains)):
        return None
    return Refusal(UNSCHEDULABLE, (
        f"job {spec.id} can never run here: it needs at least {smallest} GPUs of one type, "
        f"more than any cell of tenant {tenant} holds ({_cells_text(model, tenant)}), and "
        f"{off}; ask for fewer GPUs or for larger cells"))


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``hops_tenants[tenant]``: the tenant's virtual cluster as of a plan
    (or a leader's start), with the leader and term that wrote it."""

    view: TenantView
    at: float
    term: int
    leader: str
    v: int = 1


def tenant_records(views: Iterable[TenantView], at: float, term: int, leader: str
                   ) -> dict[str, bytes]:
    """``hops_tenants``' values, by tenant."""
    return {v.tenant: msgspec.json.encode(TenantRecord(view=v, at=at, term=term, leader=leader))
            for v in views}
