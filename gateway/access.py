"""Who may do what on the gateway: the decisions, without I/O.

Every request but ``/healthz`` carries ``Authorization: Bearer <token>``; the
tenants file (:mod:`shared.tenants`) says whom the token acts for. A tenant
acts only on its own jobs: its submissions are its tenant's whatever the
body says (a body naming another tenant is refused, 403), and another
tenant's job answers 404 as one that does not exist, so that ids do not
leak. Admins see and do everything, the operator's endpoints (node removal)
included. ``GET /tenants`` (the tenants' virtual clusters and the cells
they are bound to) shows an admin every tenant and a tenant only its own.
A gateway started ``--insecure`` has no tenants file: every caller is an
admin. :mod:`gateway.auth` is the shell that applies these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from shared.ids import JobId
from shared.jobkeys import local_id, split_key
from shared.records import QueueView
from shared.tenants import DEFAULT_TENANT, Principal, TenantsFile, authenticate
from shared.wire import FORBIDDEN, UNAUTHORIZED

NOT_FOUND = "not_found"
# Every caller of a gateway without a tenants file (``--insecure``).
INSECURE = Principal(name="insecure", admin=True)
ANONYMOUS = "anonymous"
# What a tenant sees in place of another tenant's job id (``GET /cluster``).
OTHER_JOB = "(another tenant)"
_HINT = (
    "send `Authorization: Bearer <token>` (hops: --token, $HOPS_TOKEN or the "
    "token in .hops/cli.yaml)"
)


class Denied(msgspec.Struct, frozen=True):
    """A refusal: the status and code the client gets, the sentence it reads,
    and the reason the audit records (it may say more than the client is told)."""

    status: int
    code: str
    error: str
    reason: str
    audit: str = ""  # the audit's code when it is not ``code`` (a hidden refusal)

    @property
    def audit_code(self) -> str:
        return self.audit or self.code


def identity(principal: Principal | None) -> str:
    """Who acted, for the log and the audit."""
    if principal is None:
        return ANONYMOUS
    if principal.admin:
        return f"admin-{principal.name}"
    return f"tenant-{principal.tenant}"


def identify(tenants: TenantsFile | None, authorization: str | None) -> Principal | Denied:
    """The principal an ``Authorization`` header acts for, or a 401."""
    if tenants is None:
        return INSECURE
    if not authorization:
        return Denied(401, UNAUTHORIZED, f"this gateway needs a bearer token: {_HINT}",
                      "no Authorization header")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return Denied(401, UNAUTHORIZED, f"the Authorization header is not a bearer token: {_HINT}",
                      f"Authorization scheme {scheme[:20]!r}")
    principal = authenticate(tenants, token.strip())
    if principal is None:
        return Denied(401, UNAUTHORIZED,
                      "the bearer token is not valid here (unknown, or revoked from the "
                      "tenants file)", "unknown token")
    return principal


def may_see(principal: Principal, tenant: str) -> bool:
    """Whether ``principal`` may see (and cancel) a job of ``tenant``."""
    return principal.admin or principal.tenant == tenant


def hidden(principal: Principal, job_id: str, tenant: str) -> Denied:
    """Another tenant's job: a 404 like a job that does not exist, audited forbidden."""
    return Denied(404, NOT_FOUND, f"no job {job_id!r}",
                  f"job {job_id} belongs to tenant {tenant}, not to {identity(principal)}",
                  audit=FORBIDDEN)


def admin_only(principal: Principal, what: str) -> Denied | None:
    """A 403 for a tenant on an operator's endpoint."""
    if principal.admin:
        return None
    error = f"{what} is for admins; tenant {principal.tenant} may not do it"
    return Denied(403, FORBIDDEN, error, error)


def list_tenant(principal: Principal, requested: str | None) -> str | Denied | None:
    """The tenant ``GET /jobs`` lists: an admin's choice (None: all), a
    tenant's own (asking for another's is a 403)."""
    if principal.admin:
        return requested
    if requested not in (None, principal.tenant):
        error = f"tenant {principal.tenant} may list only its own jobs, not tenant {requested}'s"
        return Denied(403, FORBIDDEN, error, error)
    return principal.tenant


def tenants_scope(principal: Principal, requested: str | None) -> str | Denied | None:
    """The tenant ``GET /tenants`` shows: an admin's choice (None: every
    tenant), a tenant's own (asking for another's is a 403)."""
    if principal.admin:
        return requested
    if requested not in (None, principal.tenant):
        error = (f"tenant {principal.tenant} may see only its own virtual cluster, "
                 f"not tenant {requested}'s")
        return Denied(403, FORBIDDEN, error, error)
    return principal.tenant


# The fields of a tenant's view (scheduling.cells.TenantView) that list jobs.
_VIEW_JOBS = ("guaranteed_jobs", "opportunistic_jobs")


def tenants_body(records: Iterable[Any], scope: str | None, by_id: bool = False
                 ) -> dict[str, Any]:
    """``GET /tenants``' body: the ``hops_tenants`` records (as JSON values)
    of tenant ``scope`` (None: all), by tenant; ``by_id`` (a tenant's own
    view) names its jobs by their ids, not their keys."""
    shown = sorted((r for r in records if scope is None or r["view"]["tenant"] == scope),
                   key=lambda r: str(r["view"]["tenant"]))
    if by_id:
        shown = [{**r, "view": view_by_id(r["view"])} for r in shown]
    return {"tenants": shown}


def view_by_id(view: dict[str, Any]) -> dict[str, Any]:
    """A tenant's view with its jobs named by their ids (:func:`shared.jobkeys.local_id`)."""
    return {**view, **{f: [local_id(j) for j in view.get(f, [])] for f in _VIEW_JOBS}}


def _submit_target(doc: Any) -> dict[str, Any] | None:
    """The spec object of a submit body (a JobSpec, or a ``submit_job``'s
    ``spec``), as the scheduler's decoder finds it; None when there is none
    (then the scheduler refuses the body whatever its tenant)."""
    if not isinstance(doc, dict):
        return None
    kind = doc.get("type")
    target = doc if kind is None else doc.get("spec") if kind == "submit_job" else None
    return target if isinstance(target, dict) else None


def submit_body(principal: Principal, body: bytes) -> bytes | Denied:
    """The body to forward for ``principal``: an admin's as it came (it may
    submit for any tenant); a tenant's with its own tenant set, or a 403 when
    it names another. A body that is no submission at all goes as it came:
    the scheduler refuses it as it would on NATS."""
    if principal.admin or principal.tenant is None:
        return body
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body
    target = _submit_target(doc)
    if target is None:
        return body
    named = target.get("tenant")
    if not isinstance(named, str | None):
        return body  # not a tenant at all: the scheduler says invalid
    if named not in (None, DEFAULT_TENANT, principal.tenant):
        error = (f"tenant {principal.tenant} may not submit a job for tenant {named} "
                 f"(leave tenant out, or set it to {principal.tenant})")
        return Denied(403, FORBIDDEN, error, error)
    target["tenant"] = principal.tenant
    return msgspec.json.encode(doc)


def job_tenant(principal: Principal, requested: str | None) -> str | Denied:
    """The tenant whose job a one-job request (``/jobs/{id}``) names: an
    admin's ``?tenant=`` (None: ``default``); a tenant's own, and naming
    another tenant is a 403 whether or not such a job exists (the answer
    depends on the request alone, so it tells nothing)."""
    if principal.admin or principal.tenant is None:
        return requested if requested is not None else DEFAULT_TENANT
    if requested not in (None, principal.tenant):
        error = (f"tenant {principal.tenant} may name only its own jobs, not tenant "
                 f"{requested}'s (leave tenant out)")
        return Denied(403, FORBIDDEN, error, error)
    return principal.tenant


def job_location(principal: Principal, key: str) -> str:
    """Where the job of ``key`` is read, for a ``Location`` header: a
    tenant's by its id, an admin's of another tenant than ``default`` with
    ``?tenant=``."""
    tenant, job_id = split_key(key)
    if tenant is None or not principal.admin:
        return f"/jobs/{job_id}"
    return f"/jobs/{job_id}?tenant={tenant}"


def own_queue(view: QueueView, own: Iterable[str]) -> QueueView:
    """The queue view with only the jobs of ``own`` (a tenant's keys), each
    named by its id (:func:`shared.jobkeys.local_id`)."""
    mine = set(own)
    entries = tuple(msgspec.structs.replace(e, job_id=JobId(local_id(e.job_id)))
                    for e in view.entries if e.job_id in mine)
    return msgspec.structs.replace(view, entries=entries)


def redact_cluster(view: dict[str, Any], own: Iterable[str]) -> dict[str, Any]:
    """The cluster view for a tenant (``own``: its jobs' keys): its jobs
    named by their ids, other tenants' by :data:`OTHER_JOB` (the GPUs they
    hold stay counted as used), and the operator's diagnostics left out."""
    mine = set(own)

    def name(job_id: str | None) -> str | None:
        if job_id is None:
            return None
        return local_id(job_id) if job_id in mine else OTHER_JOB

    servers = []
    for s in view["servers"]:
        slots = [{**g, "job_id": name(g["job_id"])} for g in s["gpu_slots"]]
        jobs = sorted({str(name(j)) for j in s["jobs"]})
        servers.append({**s, "gpu_slots": slots, "jobs": jobs})
    return {**view, "servers": servers, "unknown_servers": {}, "double_booked": []}
