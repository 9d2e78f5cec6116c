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
"""

from __future__ import annotations

import re

import msgspec

from shared.ids import JobId
from shared.job import JobSpec
from shared.records import JobRecord

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
