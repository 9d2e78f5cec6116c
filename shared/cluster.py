"""Cluster model: GPU types with their bandwidths, and servers (Hops §3.3, Eq. 2)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from functools import cached_property

import msgspec

from shared.ids import GpuType, ServerId
from shared.resources import Resources

OVERLAP_RESIDUAL = 0.2
"""T̃c / T_c of Eq. (1): the share of communication not hidden behind BP, which
the paper sets empirically to 0.2 (§3.5)."""


class GpuTypeSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A GPU type and the communication model Eqs. (1)-(2) use for it.

    Both bandwidths are in *parameters per second*, as in the paper: they are
    effective values measured offline by timing all-reduce of known sizes.

    The other three fields are a documented departure from the paper, whose
    Eq. (2) has no latency term and whose Eq. (1) fixes T̃c = 0.2·T_c; their
    defaults reproduce the paper exactly:

    - ``overlap_residual``: T̃c / T_c of Eq. (1), in [0, 1]. A device whose
      cores run both the backward pass and the all-reduce (a CPU core
      standing in for a GPU) cannot hide communication behind BP: 1.0.
    - ``link_latency_s``, ``net_latency_s``: the fixed cost α of one
      gradient all-reduce on one node and across nodes, in seconds, added to
      Eq. (2) as in the alpha-beta model (T_c = α + params/B …; zero for a
      single GPU). Small models on slow collectives are latency-bound, which
      a bandwidth alone cannot express.
    """

    name: GpuType
    link_bandwidth: float
    net_bandwidth: float
    overlap_residual: float = OVERLAP_RESIDUAL
    link_latency_s: float = 0.0
    net_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("gpu type name must not be empty")
        if self.link_bandwidth <= 0:
            raise ValueError(f"gpu type {self.name}: link_bandwidth must be > 0")
        if self.net_bandwidth <= 0:
            raise ValueError(f"gpu type {self.name}: net_bandwidth must be > 0")
        if not 0.0 <= self.overlap_residual <= 1.0:  # NaN fails too
            raise ValueError(
                f"gpu type {self.name}: overlap_residual must lie in [0, 1], "
                f"got {self.overlap_residual}"
            )
        for field, value in (("link_latency_s", self.link_latency_s),
                             ("net_latency_s", self.net_latency_s)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"gpu type {self.name}: {field} must be finite and >= 0, got {value}"
                )


class Server(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One server entity. Two servers of one GPU type may still differ in the
    attributes below, which is what the entity layer of the database learns.

    Its :attr:`capacity` names what may be allocated on it: ``gpus``,
    ``cores`` (CPU cores; 0 when none are scheduled) and ``memory_gb``.
    ``memory_bandwidth_gbps`` (0: not declared) is what CODA's contention
    eliminator (§V-D) compares the server's measured memory traffic with, and
    ``mba`` says whether its CPUs can throttle a job's bandwidth (Intel MBA)."""

    id: ServerId
    gpu_type: GpuType
    gpus: int
    model: str = ""
    cpu: str = ""
    memory_gb: int = 0
    network: str = ""
    cores: int = 0
    memory_bandwidth_gbps: float = 0.0
    mba: bool = False

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("server id must not be empty")
        if self.gpus <= 0:
            raise ValueError(f"server {self.id}: gpus must be > 0, got {self.gpus}")
        for field, value in (("cores", self.cores), ("memory_gb", self.memory_gb)):
            if value < 0:
                raise ValueError(f"server {self.id}: {field} must be >= 0, got {value}")
        if not math.isfinite(self.memory_bandwidth_gbps) or self.memory_bandwidth_gbps < 0:
            raise ValueError(f"server {self.id}: memory_bandwidth_gbps must be finite and >= 0")

    @property
    def capacity(self) -> Resources:
        return Resources(gpus=self.gpus, cores=self.cores, memory_mb=self.memory_gb * 1024)


class Cluster(msgspec.Struct, frozen=True, forbid_unknown_fields=True, dict=True):
    """The servers in their global order (adjacency follows this order) and
    the GPU types they use."""

    gpu_types: tuple[GpuTypeSpec, ...]
    servers: tuple[Server, ...]
    name: str = "cluster"

    def __post_init__(self) -> None:
        type_names = [t.name for t in self.gpu_types]
        if len(set(type_names)) != len(type_names):
            raise ValueError("gpu_types: duplicate type name")
        ids = [s.id for s in self.servers]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[0]
            raise ValueError(f"servers: duplicate server id {dup!r}")
        known = set(type_names)
        for s in self.servers:
            if s.gpu_type not in known:
                raise ValueError(f"server {s.id}: unknown gpu_type {s.gpu_type!r}")

    @cached_property
    def server_index(self) -> dict[ServerId, int]:
        return {s.id: i for i, s in enumerate(self.servers)}

    @cached_property
    def by_id(self) -> dict[ServerId, Server]:
        return {s.id: s for s in self.servers}

    @cached_property
    def type_by_name(self) -> dict[GpuType, GpuTypeSpec]:
        return {t.name: t for t in self.gpu_types}

    @cached_property
    def total_gpus(self) -> int:
        return sum(s.gpus for s in self.servers)

    def servers_of_type(self, gpu_type: GpuType) -> Iterator[Server]:
        return iter(self._servers_by_type.get(gpu_type, ()))

    @cached_property
    def _servers_by_type(self) -> dict[GpuType, tuple[Server, ...]]:
        """Each type's servers in cluster order."""
        out: dict[GpuType, list[Server]] = {}
        for s in self.servers:
            out.setdefault(s.gpu_type, []).append(s)
        return {t: tuple(group) for t, group in out.items()}

    def type_gpus(self, gpu_type: GpuType) -> int:
        return sum(s.gpus for s in self.servers_of_type(gpu_type))

    def type_share(self) -> dict[GpuType, float]:
        """P(type = j) of Eq. (9): N_type / N_cluster (a copy; computed once)."""
        return dict(self._type_share)

    @cached_property
    def _type_share(self) -> dict[GpuType, float]:
        total = self.total_gpus
        return {t.name: self.type_gpus(t.name) / total for t in self.gpu_types} if total else {}

    def free_by_type(self, free: Mapping[ServerId, int]) -> dict[GpuType, int]:
        """GPUs per type among ``free`` (GPUs per server; a server not named
        has none free), every type of the cluster listed: what the baselines'
        allocation stages know of the servers (Sia, Gavel)."""
        capacity = {t.name: 0 for t in self.gpu_types}
        for s in self.servers:
            capacity[s.gpu_type] += free.get(s.id, 0)
        return capacity

    def capacity(self) -> dict[ServerId, Resources]:
        """What may be allocated on each server (:attr:`Server.capacity`; a
        copy, computed once: the simulator checks every plan against it)."""
        return dict(self._capacity)

    @cached_property
    def _capacity(self) -> dict[ServerId, Resources]:
        return {s.id: s.capacity for s in self.servers}

    def max_server_gpus(self, gpu_type: GpuType) -> int:
        return max((s.gpus for s in self.servers_of_type(gpu_type)), default=0)
