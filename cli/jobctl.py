"""``hops cancel`` with filters, ``hops hold`` and ``hops release``: the
logic behind the commands of :mod:`cli.main`, over the gateway's one-job
endpoints (``DELETE /jobs/{id}``, ``POST /jobs/{id}/hold|release``).

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
from shared.records import FINAL_PHASES

# What a bulk cancel may select by phase: a job that ended cannot be cancelled.
CANCELLABLE = ("submitted", "profiling", "queued", "running")


class Selection(Exception):
    """Filters that select nothing sensible (exit 2)."""


def check_filters(ids: Sequence[str], tenant: str | None, phase: str | None,
                  every: bool) -> None:
    """Raise :class:`Selection` unless exactly one way of choosing jobs is given."""
    filtered = tenant is not None or phase is not None or every
    if ids and filtered:
        raise Selection("give job ids, or --tenant/--phase/--all, not both")
    if not ids and not filtered:
        raise Selection("name the jobs: ids, --tenant T, --phase P or --all")
    if phase is not None and phase not in CANCELLABLE:
        raise Selection(f"--phase must be one of {', '.join(CANCELLABLE)} "
                        f"(a job that ended cannot be cancelled), not {phase!r}")


def matching(client: GatewayClient, tenant: str | None, phase: str | None) -> list[str]:
    """The ids of the jobs that have not ended and match the filters (the
    gateway shows a tenant's token only its own jobs)."""
    body = client.jobs(JobsQuery(phase=phase, tenant=tenant))
    jobs: list[dict[str, Any]] = list(body.get("jobs", []))
    return [j["job_id"] for j in jobs if j.get("phase") not in FINAL_PHASES]


def cancel_each(client: GatewayClient, ids: Sequence[str], reason: str,
                echo: Callable[[str], None]) -> int:
    """Cancel every job of ``ids``, one line each and a summary; how many were refused."""
    refused = 0
    for job_id in ids:
        answer: Answer = client.cancel(job_id, reason)
        echo(render_answer(job_id, answer, verb="cancelled"))
        refused += not answer.ok
    echo(f"{len(ids) - refused} of {len(ids)} cancelled"
         + (f", {refused} refused" if refused else ""))
    return refused


def listing(ids: Sequence[str]) -> str:
    """The jobs a bulk cancel is about to cancel, for the question."""
    shown = ", ".join(ids[:20]) + (f", ... ({len(ids) - 20} more)" if len(ids) > 20 else "")
    return f"{len(ids)} job{'s' if len(ids) != 1 else ''} match: {shown}"
