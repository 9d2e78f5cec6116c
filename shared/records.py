"""Values kept in the live system's KV buckets, and the queue view.

One owner writes each bucket (docs/events.md): the scheduler ``hops_jobs``,
the placer ``hops_alloc`` (the monitor deletes entries when it releases
resources), the monitor ``hops_nodes``. Every other service only reads them.
Like events, records are versioned and every field after the required ones
has a default, so a newer writer never breaks an older reader.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.explain import JobForecast, Why
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.node import Device

JobPhase = Literal[
    "submitted", "profiling", "queued", "running", "finished", "failed", "cancelled"
]
FINAL_PHASES: frozenset[str] = frozenset({"finished", "failed", "cancelled"})


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``hops_jobs[job_id]``: what the scheduler knows of one job.

    ``profiled`` lists the GPU types with a profile report (§3.2);
    ``configuration`` is the placement the job runs under while ``running``;
    ``samples_done`` is the progress last reported (a resumed job restarts
    from it); ``attained_by_type`` is GPU-seconds run per GPU type.
    """

    spec: JobSpec
    submitted_at: float
    v: int = 1
    phase: JobPhase = "submitted"
    profiled: tuple[GpuType, ...] = ()
    configuration: Configuration | None = None
    samples_done: float = 0.0
    first_start: float | None = None
    finished_at: float | None = None
    restarts: int = 0
    attained_by_type: dict[GpuType, float] = {}
    reason: str = ""
    # Held by a user (``hops hold``): in no plan until released; its reason
    # starts with ``held`` (Slurm's JobHeldUser).
    held: bool = False

    @property
    def job_id(self) -> JobId:
        return self.spec.id

    @property
    def final(self) -> bool:
        return self.phase in FINAL_PHASES


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """``hops_alloc[job_id]``: GPUs booked for a job by the placer.

    ``gpu_indices`` names the booked GPUs per server (as many as the
    configuration gives that server); ``mode`` is ``profile`` for a profiling
    run (one GPU) and ``run`` otherwise; ``key`` is the idempotency key of the
    start commands that booked it.
    """

    job_id: JobId
    configuration: Configuration
    gpu_indices: dict[ServerId, tuple[int, ...]]
    v: int = 1
    mode: Literal["run", "profile"] = "run"
    key: str = ""
    at: float = 0.0


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``hops_nodes[server_id]``: a registered executor's server."""

    server: Server
    gpu_type: GpuTypeSpec
    v: int = 1
    order: int = 0
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    alive: bool = True
    address: str = ""
    devices: tuple[Device, ...] = ()
    models: tuple[str, ...] = ()  # register_node.models: empty means any
    # Memory bandwidth in use (GB/s) its last written heartbeat reported
    # (resctrl's MBM; 0: not measured): CODA's eliminator reads it.
    memory_bandwidth_gbps: float = 0.0
    # An operator drained it (``drain_node``): no new work goes there; with
    # ``drain_move`` its running jobs are moved off at the next round too.
    # Kept when the node registers again; only ``undrain`` clears it.
    drained: bool = False
    drain_move: bool = False


class QueueEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One waiting job as the planner sees it: priority (Eq. 8), latency
    ratio, and whether it is inside the service window (§3.4)."""

    job_id: JobId
    priority: float
    latency_ratio: float
    in_window: bool
    phase: JobPhase = "queued"
    v: int = 1
    # Why it is not ranked: ``held`` for a held job (empty: it is).
    reason: str = ""
    # Its primary reason in the last plan, and its place and forecast
    # (shared.explain; 0 / None until the leader's first forecast).
    why: Why | None = None
    position: int = 0
    tenant_position: int = 0
    forecast: JobForecast | None = None


class QueueView(msgspec.Struct, frozen=True, kw_only=True):
    """Reply of ``hops.v1.queue``: the waiting jobs in priority order."""

    entries: tuple[QueueEntry, ...] = ()
    at: float = 0.0
    leader: str = ""
    term: int = 0
    ok: bool = True
    error: str = ""
    v: int = 1
