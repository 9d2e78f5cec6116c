"""Which GPU types each job has a valid profile on (Hops §3.2), without I/O.

A new job runs a few iterations on one GPU of every type (the scheduler's
plans carry a ``ProfilingTask`` per type; the placer starts it as a
``start_job`` with mode ``profile`` and the node's executor runs it on the
GPU the task names, then publishes a ``profile_reported``). The profiler
service checks each report against the registered nodes and, for a valid
one, publishes the *cumulative* list of the job's profiled types as
``job_profiled``, so the scheduler can tell when a job is fully profiled.

A report is refused (an ``error_record``, no state change) when its server
is not registered (``unknown_server``), its GPU type is the type of no
registered node (``unknown_gpu_type``), its server has another type
(``type_mismatch``) or its job was never submitted (``unknown_job``).
Reports for a job that has ended are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ProfileReport

UNKNOWN_SERVER = "unknown_server"
UNKNOWN_GPU_TYPE = "unknown_gpu_type"
TYPE_MISMATCH = "type_mismatch"
UNKNOWN_JOB = "unknown_job"


class Verdict(msgspec.Struct, frozen=True):
    """``accept``, ``ignore`` (a job that ended) or ``reject`` with a code."""

    outcome: Literal["accept", "ignore", "reject"]
    code: str = ""
    message: str = ""


def check_report(
    report: ProfileReport,
    server_type: GpuType | None,
    known_types: Iterable[GpuType],
    job_phase: str | None,
) -> Verdict:
    """Judge ``report``: ``server_type`` is the registered type of its server
    (``None``: not registered), ``known_types`` every registered type, and
    ``job_phase`` the job's phase (``None``: no such job)."""
    where = f"profile of {report.job_id} on {report.server_id} ({report.gpu_type})"
    if server_type is None:
        return Verdict("reject", UNKNOWN_SERVER, f"{where}: server is not registered")
    if report.gpu_type not in set(known_types):
        return Verdict("reject", UNKNOWN_GPU_TYPE, f"{where}: no registered node has this type")
    if server_type != report.gpu_type:
        return Verdict("reject", TYPE_MISMATCH, f"{where}: the server's GPU type is {server_type}")
    if job_phase is None:
        return Verdict("reject", UNKNOWN_JOB, f"{where}: no such job")
    if job_phase in ("finished", "failed", "cancelled"):
        return Verdict("ignore", message=f"{where}: the job is {job_phase}")
    return Verdict("accept")


class ProfileTracker:
    """Per job, the GPU types with an accepted profile report."""

    def __init__(self) -> None:
        self._types: dict[JobId, frozenset[GpuType]] = {}

    def knows(self, job_id: JobId) -> bool:
        return job_id in self._types

    def seed(self, job_id: JobId, types: Iterable[GpuType]) -> None:
        """Start from what is known elsewhere (the job record's ``profiled``),
        e.g. after a restart; adds to what the tracker has."""
        self._types[job_id] = self._types.get(job_id, frozenset()) | frozenset(types)

    def accept(self, report: ProfileReport) -> tuple[GpuType, ...]:
        """Record an accepted report; the job's profiled types, sorted."""
        self.seed(report.job_id, (report.gpu_type,))
        return self.types(report.job_id)

    def types(self, job_id: JobId) -> tuple[GpuType, ...]:
        return tuple(sorted(self._types.get(job_id, frozenset())))

    def forget(self, job_id: JobId) -> None:
        self._types.pop(job_id, None)


def profiled_msg_id(job_id: JobId, types: Iterable[GpuType]) -> str:
    """The ``Nats-Msg-Id`` of a ``job_profiled``: the same cumulative set
    (a redelivered report) gives the same id, which JetStream drops."""
    return f"{job_id}:job_profiled:{'+'.join(sorted(types))}"


def registered_types(servers: Mapping[ServerId, GpuType]) -> frozenset[GpuType]:
    return frozenset(servers.values())
