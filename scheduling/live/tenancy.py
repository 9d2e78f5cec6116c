"""Tenants at admission, and the tenants' event feed: the decisions, without I/O.

Trusted callers (the gateway, an admin) submit and cancel on the bare
``hops.v1.jobs.submit``/``cancel`` and set ``spec.tenant`` themselves; a
tenant's own NATS clients use ``hops.v1.jobs.submit.<tenant>`` and
``hops.v1.jobs.cancel.<tenant>``, and there the tenant is the subject's last
token (nats-server lets a tenant's credential publish only its own), never
the payload's:

- a spec naming another tenant is ``forbidden``; one naming none (the
  default, ``default``) gets the subject's tenant;
- a tenant names its jobs by the ids it gave them; each tenant's ids are
  its own (the job's key is ``tenant/id``, :mod:`shared.jobkeys`), so a
  tenant's cancel or hold never reaches another's job; one that would
  (a record written before keys were qualified) answers ``not_found``, as
  for a job that does not exist, so that job ids do not leak (it is audited
  ``forbidden``).

On every path, a tenant the tenants file does not name is ``forbidden``, and
so is a job with a ``command`` whose tenant may not run commands
(``run_commands``; docs/security.md).
"""

from __future__ import annotations

import msgspec

from shared import events as ev
from shared import subjects
from shared.ids import JobId, TenantId
from shared.job import JobSpec
from shared.jobkeys import local_id
from shared.records import JobRecord
from shared.subjects import SubjectError
from shared.tenants import DEFAULT_TENANT, TenantsFile, may_run_commands
from shared.wire import FORBIDDEN

NOT_FOUND = "not_found"


class TenantRefusal(msgspec.Struct, frozen=True):
    """A refusal: the reply's code and message, and the code it is audited under."""

    code: str
    message: str
    audit: str = ""


def scope_of(subject: str, pattern: str) -> str | None:
    """The tenant a tenant-scoped ``subject`` names (``pattern`` is its
    wildcard form), None for anything else (the bare, trusted subjects)."""
    try:
        return subjects.last_token(subject, pattern)
    except SubjectError:
        return None


def scoped_spec(spec: JobSpec, scope: str | None) -> tuple[JobSpec, TenantRefusal | None]:
    """``spec`` with the tenant of the subject it came on, or why not."""
    if scope is None or spec.tenant == scope:
        return spec, None
    if spec.tenant != DEFAULT_TENANT:
        return spec, TenantRefusal(
            FORBIDDEN,
            f"tenant {scope} may not submit job {spec.id} for tenant {spec.tenant} "
            f"(leave tenant out, or set it to {scope})",
        )
    return msgspec.structs.replace(spec, tenant=TenantId(scope)), None


def tenant_refusal(tenants: TenantsFile, spec: JobSpec) -> TenantRefusal | None:
    """Why ``spec``'s tenant may not submit it (unknown, or a command it may
    not run), or None."""
    if spec.tenant not in tenants.tenants:
        return TenantRefusal(
            FORBIDDEN, f"job {spec.id}: tenant {spec.tenant!r} is not in the tenants file"
        )
    if spec.command and not may_run_commands(tenants, spec.tenant):
        return TenantRefusal(
            FORBIDDEN,
            f"job {spec.id} has a command, but tenant {spec.tenant} may not run commands "
            "(run_commands is not set for it in the tenants file); leave command out to "
            "run it on an emulated executor",
        )
    return None


def submit_refusal(
    tenants: TenantsFile, spec: JobSpec, scope: str | None
) -> tuple[JobSpec, TenantRefusal | None]:
    """The spec to admit, or why not, for a submission on a subject of
    tenant ``scope`` (None: a trusted caller's)."""
    spec, refusal = scoped_spec(spec, scope)
    return spec, refusal or tenant_refusal(tenants, spec)


def cancel_scope_refusal(
    tenants: TenantsFile, job_id: JobId, record: JobRecord | None, scope: str | None
) -> TenantRefusal | None:
    """Why tenant ``scope`` may not cancel ``job_id`` (None: a trusted caller
    may cancel anything, and so may a tenant its own jobs)."""
    if scope is None:
        return None
    if scope not in tenants.tenants:
        return TenantRefusal(FORBIDDEN, f"tenant {scope!r} is not in the tenants file")
    if record is not None and record.spec.tenant != scope:
        # answered like a job that does not exist: ids of others do not leak
        return TenantRefusal(NOT_FOUND, f"no job {job_id}", audit=FORBIDDEN)
    return None


def stranded_problem(tenants: TenantsFile | None, tenant: str) -> str | None:
    """Why a job of ``tenant`` may not be planned (None: it may): the
    tenants file no longer names its tenant. Such a job is held, reason
    ``unknown_tenant`` (:func:`scheduling.live.state.hold_tenant`), never
    silently stranded; ``tenants`` None checks nothing."""
    if tenants is None or tenant in tenants.tenants:
        return None
    return (f"tenant {tenant!r} is not in the tenants file; add it and run "
            f"'hops tenants reload', or cancel its jobs (hops cancel --tenant {tenant} --yes)")


def reload_refusal(old: TenantsFile, new: TenantsFile, needs_cells: bool) -> str | None:
    """Why a reload may not swap ``new`` in for ``old`` (None: it may). A
    policy that plans with the cells keeps bindings to them in its layer
    state (HiveD's, hops_state); changing the cells under them is not safe
    in place, so a cells change needs a restart. Tenants, tokens and
    ``run_commands`` apply at once."""
    if needs_cells and new.cells != old.cells:
        return ("the cells section changed, and the policy plans with the cells: changing "
                "cells needs a restart of the schedulers (tenants, tokens and run_commands "
                "apply on reload)")
    return None


def feed_subject(
    record: JobRecord | None, event: ev.JobEvent, first_delivery: bool, changed: bool
) -> str | None:
    """Where the leader republishes ``event`` for its tenant, or None: an
    event of no known job, or one delivered again that changed nothing (a
    leader before this one republished it already)."""
    if record is None or not (first_delivery or changed):
        return None
    try:
        return subjects.tenant_events(record.spec.tenant, local_id(event.job_id))
    except SubjectError:  # a tenant that cannot be a subject token has no feed
        return None


def feed_event(event: ev.JobEvent) -> ev.JobEvent:
    """``event`` as its tenant's feed carries it: naming the job by the id
    the tenant gave it, not by its key (:mod:`shared.jobkeys`)."""
    job_id = JobId(local_id(event.job_id))
    if isinstance(event, ev.JobSubmitted):
        spec = msgspec.structs.replace(event.spec, id=job_id)
        return msgspec.structs.replace(event, job_id=job_id, spec=spec)
    return msgspec.structs.replace(event, job_id=job_id)
