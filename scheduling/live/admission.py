"""Admission of submissions and cancels: the decisions, without I/O.

Every scheduler replica admits (queue group ``admission``), the leader and
the standbys alike, so that jobs are accepted during a failover. Decoding
has already checked the spec's schema and values (``shared.job.JobSpec``);
this module adds what the live system needs on top:

- the job id must also be a valid KV key (``hops_jobs`` is keyed by it):
  letters, digits, ``-``, ``_`` and ``=``, at most :data:`MAX_ID_LENGTH`;
- the requirement set must be usable: at most :data:`MAX_GPUS` GPUs;
- ``submit_time`` is the time the scheduler accepted the job (a client's
  value is overwritten), because the queue orders ties by it (§3.6).

A duplicate id is a ``conflict``; cancelling an unknown job is ``not_found``
and cancelling a job that already ended is a ``conflict``.

Against the registered nodes (``hops_nodes``, alive or not: a node that is
down for a while is still the cluster's until an operator removes it), as
Kueue refuses a workload no flavor can ever hold:

- a job none of whose requirements fits any GPU type (a configuration never
  mixes types, §3.4) is ``unschedulable``, naming its smallest requirement
  and the most GPUs one type holds;
- a model no node can run is ``invalid`` when every node names the models it
  can run (emulated executors do; real ones run any command).

With no node registered yet (a cluster starting) nothing can be judged and
the job is admitted; the leader holds it as unschedulable until it fits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from shared.ids import GpuType, JobId
from shared.job import JobSpec
from shared.records import JobRecord, NodeRecord
from shared.wire import INVALID, UNSCHEDULABLE

MAX_ID_LENGTH = 128
MAX_GPUS = 4096
NOT_FOUND = "not_found"
CONFLICT = "conflict"
_ID = re.compile(r"[A-Za-z0-9_=-]+")


class Refusal(msgspec.Struct, frozen=True):
    """Why a request is refused: an error code and a message for the client."""

    code: str
    message: str


def valid_id(job_id: str) -> bool:
    """Whether ``job_id`` could name a job (the rules of :func:`check_spec`)."""
    return len(job_id) <= MAX_ID_LENGTH and _ID.fullmatch(job_id) is not None


def check_spec(spec: JobSpec) -> str | None:
    """What is wrong with ``spec`` for the live system, or ``None``."""
    problem = spec_problem(spec)
    return problem[1] if problem else None


def spec_problem(spec: JobSpec) -> tuple[str, str] | None:
    """The field of ``spec`` the live system cannot take and why, or ``None``
    (``hops submit`` checks a whole file with it before sending anything)."""
    if len(spec.id) > MAX_ID_LENGTH:
        return "id", (
            f"job id is {len(spec.id)} characters long; at most {MAX_ID_LENGTH} are allowed"
        )
    if not _ID.fullmatch(spec.id):
        return "id", (
            f"job id {spec.id!r} may only contain letters, digits, '-', '_' and '=' "
            "(it is a subject token and a KV key)"
        )
    if not spec.model.strip():
        return "model", "model must not be empty"
    top = spec.max_gpus if spec.max_gpus is not None else max(spec.requirements)
    if top > MAX_GPUS:
        field = "max_gpus" if spec.max_gpus is not None else "requirements"
        return field, f"requirements ask for {top} GPUs; at most {MAX_GPUS} are allowed"
    return None


def accepted_spec(spec: JobSpec, now: float) -> JobSpec:
    """The spec as stored: stamped with the acceptance time."""
    return msgspec.structs.replace(spec, submit_time=now)


def duplicate(job_id: JobId, existing: JobRecord | None) -> Refusal | None:
    """A ``conflict`` when a job with this id exists already."""
    if existing is None:
        return None
    return Refusal(CONFLICT, f"job {job_id} exists already (phase {existing.phase})")


def cancel_refusal(job_id: JobId, record: JobRecord | None) -> Refusal | None:
    """Why ``job_id`` cannot be cancelled, or ``None`` when it can."""
    if record is None:
        return Refusal(NOT_FOUND, f"no job {job_id}")
    if record.final:
        return Refusal(CONFLICT, f"job {job_id} is {record.phase} already")
    return None


def type_capacity(nodes: Iterable[NodeRecord]) -> dict[GpuType, int]:
    """GPUs of each type over ``nodes``."""
    out: dict[GpuType, int] = {}
    for n in nodes:
        out[n.server.gpu_type] = out.get(n.server.gpu_type, 0) + n.server.gpus
    return out


def unfit(spec: JobSpec, capacity: dict[GpuType, int], r_num: int) -> str | None:
    """Why no requirement of ``spec`` fits ``capacity`` (GPUs per type), or
    ``None`` when one does (or nothing is known of the cluster yet)."""
    if not capacity:
        return None
    smallest = spec.requirement_set(r_num)[0]
    most = max(capacity.values())
    if smallest <= most:
        return None
    types = ", ".join(f"{g} {t}" for t, g in sorted(capacity.items()))
    return (
        f"the job needs at least {smallest} GPUs of one type, but the cluster holds at most "
        f"{most} GPUs of one type ({types})"
    )


def fit_refusal(spec: JobSpec, nodes: Iterable[NodeRecord], r_num: int) -> Refusal | None:
    """Whether the registered ``nodes`` could ever run ``spec`` (see the module docstring)."""
    nodes = list(nodes)
    problem = unfit(spec, type_capacity(nodes), r_num)
    if problem is not None:
        return Refusal(UNSCHEDULABLE, f"job {spec.id} can never run here: {problem}")
    if nodes and all(n.models for n in nodes):
        known = sorted({m for n in nodes for m in n.models})
        if spec.model not in known:
            return Refusal(
                INVALID,
                f"model {spec.model!r} cannot run on this cluster, whose nodes emulate "
                f"only these models: {', '.join(known)}",
            )
    return None
