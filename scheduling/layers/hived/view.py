"""A tenant's virtual cluster as the inner policy sees it (HiveD §3.1-§3.2,
Figures 2 and 3: "the VC view is no different from a private cluster
consisting of nodes with different sizes").

Each reserved cell at node level or above becomes as many virtual servers
as it has nodes; each cell below node level becomes one virtual server of
its size (tenant C of Figure 3 is two 8-GPU nodes and one 2-GPU node).
Virtual server ids are ``"<tenant>/<gpu type>/<k>"``, largest cells first;
each stands for one virtual cell (and one node of it), which the cells bind
one to one to a physical cell (:mod:`scheduling.cells.slots`). The view
holds, on the virtual server concerned, the GPUs of the tenant's bound
cells that sit on bad hardware (doomed cells, §4 "Handling faulty
hardware") or that a physical hold (a profiling run) takes, so the inner
policy plans on the capacity the tenant really has, and, in a plan later in
the round, the virtual configurations of the tenant's running jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec

from scheduling.cells import CellModel, Cells, VirtualSlot, virtual_slots
from shared.cluster import Cluster, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import JobState, Snapshot


def virtual_servers(model: CellModel, tenant: str, physical: Cluster
                    ) -> list[tuple[ServerId, GpuType, VirtualSlot, int]]:
    """The tenant's virtual servers: id, GPU type, the virtual cell they
    stand for (:func:`scheduling.cells.virtual_slots`) and GPUs."""
    out = []
    for gpu in sorted(model.reservations.get(tenant, {})):
        if gpu in physical.type_by_name:
            out += [(ServerId(f"{tenant}/{gpu}/{k}"), gpu, slot, g)
                    for k, (slot, g) in enumerate(virtual_slots(model, tenant, gpu))]
    return out


def virtual_cluster(model: CellModel, tenant: str, physical: Cluster) -> Cluster | None:
    """The tenant's VC as a cluster of virtual servers; None when it has no
    cells of a GPU type the physical cluster knows."""
    servers: list[Server] = []
    for sid, gpu, _, g in virtual_servers(model, tenant, physical):
        proto = next(physical.servers_of_type(gpu), None)
        servers.append(Server(sid, gpu, g, model=proto.model if proto else "",
                              cpu=proto.cpu if proto else "",
                              network=proto.network if proto else ""))
    if not servers:
        return None
    types = {s.gpu_type for s in servers}
    return Cluster(gpu_types=tuple(t for t in physical.gpu_types if t.name in types),
                   servers=tuple(servers), name=f"{physical.name}/{tenant}")


def unavailable_holds(cells: Cells, tenant: str,
                      slots: Mapping[tuple[GpuType, VirtualSlot], ServerId]
                      ) -> dict[ServerId, int]:
    """The GPUs of each virtual server that its bound cell cannot give:
    bad ones (doomed cells, §4) and ones held outside the cells (profiling
    runs), on exactly the virtual server whose cell holds them."""
    out: dict[ServerId, int] = {}
    for gpu in sorted(cells.model.reservations.get(tenant, {})):
        for slot, lost in sorted(cells.unavailable(tenant, gpu).items()):
            sid = slots.get((gpu, slot))
            if sid is not None:
                out[sid] = lost
    return out


def virtual_state(job: JobState, virtual: Configuration | None, first_plan: bool,
                  sizes: tuple[int, ...], vc: Cluster) -> JobState | None:
    """The job as its tenant's inner policy sees it: a running guaranteed
    job where it was put in the VC; a job running outside its cells
    (opportunistically) as waiting in a first plan and not at all later;
    its requirements those its tenant's cells can hold (``sizes``); still to
    profile on the VC's GPU types only (others are profiled outside)."""
    spec = job.spec
    if sizes and sizes != spec.requirement_set():
        spec = msgspec.structs.replace(spec, requirements=sizes, min_gpus=None, max_gpus=None)
    if job.phase != "running":
        unprofiled = tuple(t for t in job.unprofiled if t in vc.type_by_name)
        return msgspec.structs.replace(job, spec=spec, unprofiled=unprofiled)
    if virtual is not None:
        return msgspec.structs.replace(job, spec=spec, current=virtual)
    if first_plan:
        return msgspec.structs.replace(job, spec=spec, phase="queued", current=None)
    return None


def virtual_estimate(est: JobEstimate, vc: Cluster) -> JobEstimate | None:
    """Per-type curves only: the server-entity layer's curves are keyed by
    physical servers, which the virtual cluster does not have."""
    by_type = {t: c for t, c in est.by_type.items() if t in vc.type_by_name}
    return JobEstimate(est.job_id, by_type) if by_type else None


def tenant_snapshot(snapshot: Snapshot, vc: Cluster, jobs: Sequence[JobState],
                    virtual: Mapping[JobId, Configuration], held: Mapping[ServerId, int],
                    sizes: Mapping[JobId, tuple[int, ...]],
                    runs: Mapping[ServerId, int] | None = None) -> Snapshot:
    """The snapshot the inner policy plans one tenant's VC from; ``runs``:
    its profiling runs in flight, per virtual server."""
    shown: list[JobState] = []
    estimates: dict[JobId, JobEstimate] = {}
    holds: Counter[ServerId] = Counter(held)
    holds.update(runs or {})
    for job in jobs:
        state = virtual_state(job, virtual.get(job.id), snapshot.first_plan, sizes[job.id], vc)
        if state is None:
            continue
        shown.append(state)
        est = snapshot.estimates.get(job.id)
        vest = virtual_estimate(est, vc) if est is not None else None
        if vest is not None:
            estimates[job.id] = vest
        if not snapshot.first_plan and state.phase == "running" and state.current is not None:
            holds.update(state.current.as_dict())
    return Snapshot(now=snapshot.now, cluster=vc, jobs=tuple(shown), estimates=estimates,
                    held={k: v for k, v in sorted(holds.items()) if v},
                    first_plan=snapshot.first_plan, profiling_held=dict(runs or {}))


def config_type(config: Configuration, vc: Cluster) -> GpuType | None:
    """The GPU type of a virtual configuration; None if it mixes types."""
    types = {vc.by_id[s].gpu_type for s in config.servers if s in vc.by_id}
    return next(iter(types)) if len(types) == 1 and len(config.servers) == len(
        [s for s in config.servers if s in vc.by_id]) else None
