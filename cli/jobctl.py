"""``hops cancel`` with filters, ``hops hold`` and ``hops release``: the
logic behind the commands of :mod:`cli.main`, over the gateway's one-job
endpoints (``DELETE /jobs/{id}``, ``POST /jobs/{id}/hold|release``).

A job is named ``id`` (the caller's own; for an admin, the ``default``
tenant's) or ``tenant/id``, or ``id`` with ``--tenant T``
(:mod:`shared.jobkeys`): an admin names another tenant's job so.

A bulk cancel is a loop over the one-job cancel, not an endpoint of its own:
the gateway lists only the caller's jobs to a tenant's token, so the
filters never match another tenant's job, and each cancel is refused or
accepted on its own (one line per job, then a summary). The matching jobs
are listed and the count confirmed first (``--yes`` skips the question;
with no terminal to ask on, and no ``--yes``, nothing is cancelled).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cli.client import Answer, GatewayClient, JobsQuery, render_answer
from shared.jobkeys import job_key, parse_ref
from shared.records import FINAL_PHASES

# What a bulk cancel may select by phase: a job that ended cannot be cancelled.
CANCELLABLE = ("submitted", "profiling", "queued", "running")


class Selection(Exception):
    """Filters that select nothing sensible (exit 2)."""


# A job as a command names it: its tenant (None: the caller's own, or for an
# admin the ``default`` tenant) and its id.
Ref = tuple[str | None, str]


def refs(ids: Sequence[str], tenant: str | None) -> list[Ref]:
    """The jobs ``ids`` name, each ``id`` or ``tenant/id`` (:func:`shared.
    jobkeys.parse_ref`), ``tenant`` being ``--tenant``; :class:`Selection`
    for an id whose tenant is not ``--tenant``."""
    try:
        return [parse_ref(i, tenant) for i in ids]
    except ValueError as exc:
        raise Selection(str(exc)) from None


def name(ref: Ref, qualified: bool = True) -> str:
    """How a line names the job: ``tenant/id`` (``qualified``, and a tenant
    other than ``default``), else its id."""
    tenant, job_id = ref
    return job_key(tenant, job_id) if qualified and tenant is not None else job_id


def check_filters(ids: Sequence[str], tenant: str | None, phase: str | None,
                  every: bool) -> None:
    """Raise :class:`Selection` unless exactly one way of choosing jobs is
    given (ids may come with ``--tenant``: those ids of that tenant)."""
    filtered = tenant is not None or phase is not None or every
    if ids and (phase is not None or every):
        raise Selection("give job ids (with --tenant T: that tenant's), or --phase/--all, "
                        "not both")
    if not ids and not filtered:
        raise Selection("name the jobs: ids, --tenant T, --phase P or --all")
    if phase is not None and phase not in CANCELLABLE:
        raise Selection(f"--phase must be one of {', '.join(CANCELLABLE)} "
                        f"(a job that ended cannot be cancelled), not {phase!r}")


def matching(client: GatewayClient, tenant: str | None, phase: str | None) -> list[Ref]:
    """The jobs that have not ended and match the filters, each with its
    tenant (the gateway shows a tenant's token only its own jobs)."""
    body = client.jobs(JobsQuery(phase=phase, tenant=tenant))
    jobs: list[dict[str, Any]] = list(body.get("jobs", []))
    return [(j["spec"].get("tenant"), j["job_id"]) for j in jobs
            if j.get("phase") not in FINAL_PHASES]


def _qualified(jobs: Sequence[Ref]) -> bool:
    """Whether lines name jobs as ``tenant/id``: when they are of several
    tenants (one tenant's own jobs are named by their ids)."""
    return len({tenant for tenant, _ in jobs}) > 1


def cancel_each(client: GatewayClient, jobs: Sequence[Ref], reason: str,
                echo: Callable[[str], None]) -> int:
    """Cancel every job of ``jobs``, one line each and a summary; how many were refused."""
    refused = 0
    qualified = _qualified(jobs)
    for tenant, job_id in jobs:
        answer: Answer = client.cancel(job_id, reason, tenant=tenant)
        echo(render_answer(name((tenant, job_id), qualified), answer, verb="cancelled"))
        refused += not answer.ok
    echo(f"{len(jobs) - refused} of {len(jobs)} cancelled"
         + (f", {refused} refused" if refused else ""))
    return refused


def listing(jobs: Sequence[Ref]) -> str:
    """The jobs a bulk cancel is about to cancel, for the question."""
    qualified = _qualified(jobs)
    ids = [name(j, qualified) for j in jobs]
    shown = ", ".join(ids[:20]) + (f", ... ({len(ids) - 20} more)" if len(ids) > 20 else "")
    return f"{len(ids)} job{'s' if len(ids) != 1 else ''} match: {shown}"
