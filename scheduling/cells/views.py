"""The frozen values the cell facade returns (all msgspec-encodable)."""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.ids import GpuType, ServerId

RefusalReason = Literal[
    "unknown-tenant", "unknown-gpu-type", "duplicate-job", "too-large", "no-cell",
    "no-capacity", "unhealthy", "preempt",
]


class ServerGpus(msgspec.Struct, frozen=True):
    """GPUs on one server: how many, and which (indices on the server)."""

    server: ServerId
    gpus: int
    indices: tuple[int, ...] = ()


class VirtualSlot(msgspec.Struct, frozen=True, order=True):
    """One virtual server of a tenant: node ``node`` of its ``index``-th
    reserved cell of ``level`` (0 below node level), in its VC view."""

    level: int
    index: int
    node: int = 0


class Allocation(msgspec.Struct, frozen=True):
    """A job's physical placement: the cells it holds and the GPUs it uses."""

    job_id: str
    tenant: str
    gpu_type: GpuType
    gpus: int
    opportunistic: bool
    cells: tuple[str, ...]
    placement: tuple[ServerGpus, ...]

    def servers(self) -> dict[ServerId, int]:
        return {p.server: p.gpus for p in self.placement}


class Refusal(msgspec.Struct, frozen=True):
    """Why a request was refused; the state is unchanged. ``preempt`` names
    the opportunistic jobs to stop first (:meth:`Cells.preemption_victims`)."""

    job_id: str
    reason: RefusalReason
    detail: str
    victims: tuple[str, ...] = ()


class Violation(msgspec.Struct, frozen=True):
    """Invariant (2) of Theorem 1 broken: r_k - a_k > f_k + F_k."""

    gpu_type: GpuType
    level: int
    unallocated: int
    available: int


class LevelCount(msgspec.Struct, frozen=True):
    """A tenant's virtual cells of one level: reserved, and bound now."""

    level: int
    cell_type: str
    gpus_per_cell: int
    reserved: int
    bound: int


class BoundCell(msgspec.Struct, frozen=True):
    """A virtual cell bound to a physical cell; ``doomed`` when bound to bad
    hardware because no healthy cell was left (§4 "Handling faulty hardware")."""

    address: str
    level: int
    gpus: int
    used_gpus: int
    bad_gpus: int
    doomed: bool
    servers: tuple[ServerGpus, ...]


class ChainView(msgspec.Struct, frozen=True):
    """A tenant's virtual cluster in one chain. ``usable`` lists, per server,
    the healthy GPUs of its bound cells that no guaranteed job holds (where
    its next jobs go first); ``unbound_gpus`` may bind anywhere."""

    gpu_type: GpuType
    levels: tuple[LevelCount, ...]
    bound: tuple[BoundCell, ...]
    reserved_gpus: int
    used_gpus: int
    free_gpus: int
    bad_gpus: int
    unbound_gpus: int
    usable: tuple[ServerGpus, ...]


class TenantView(msgspec.Struct, frozen=True):
    """What ``hops tenants`` and ``GET /tenants`` show for one tenant, and
    what its inner scheduler works on (§3.1, Figure 2: the VC view)."""

    tenant: str
    low_priority: bool
    weight: float
    chains: tuple[ChainView, ...]
    guaranteed_jobs: tuple[str, ...]
    opportunistic_jobs: tuple[str, ...]
    opportunistic_gpus: int


class SnapshotBinding(msgspec.Struct, frozen=True):
    address: str
    tenant: str
    doomed: bool = False
    slot: int = -1  # which of the tenant's virtual cells of the level; -1: the lowest free


class SnapshotJob(msgspec.Struct, frozen=True):
    job_id: str
    tenant: str
    gpu_type: GpuType
    gpus: int
    opportunistic: bool
    cells: tuple[str, ...]


class Snapshot(msgspec.Struct, frozen=True):
    """Everything that is not derived from the spec, in a canonical order:
    what a standby needs to rebuild the same state (§4 "Fault tolerance")."""

    bindings: tuple[SnapshotBinding, ...]
    jobs: tuple[SnapshotJob, ...]
    bad_servers: tuple[ServerId, ...]
