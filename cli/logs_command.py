"""``hops logs JOB``: a job's output as its executors shipped it (stream
``HOPS_LOGS``, docs/logs.md), read through ``GET /jobs/{id}/logs``.

Each line is printed as ``[server rank] text``; while every line so far
came from one rank (or ``--rank`` names one), as its bare text. ``-f``
follows the job to its end and exits 0 then.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated, Any

import typer

from cli import jobctl
from cli.client import GatewayClient
from cli.gateway_opts import ConfigOpt, GatewayOpt, TokenOpt, gateway_call


def render_lines(lines: Iterable[dict[str, Any]], one_rank: bool = False) -> Iterator[str]:
    """The lines as ``hops logs`` prints them (see the module)."""
    seen: set[tuple[str, int]] = set()
    for line in lines:
        if not line.get("capped"):
            seen.add((str(line.get("server", "")), int(line.get("rank", 0))))
        text = str(line.get("text", ""))
        if one_rank or len(seen) <= 1 or line.get("capped"):
            yield text
        else:
            yield f"[{line.get('server', '')} {line.get('rank', 0)}] {text}"


def logs(
    job_ref: Annotated[str, typer.Argument(metavar="JOB", help="the job's id, or TENANT/ID")],
    follow: Annotated[bool, typer.Option("--follow", "-f",
                                         help="go on with new lines until the job ends")] = False,
    rank: Annotated[int | None, typer.Option(min=0, help="this local rank only")] = None,
    since: Annotated[str | None, typer.Option(
        help="from this time (seconds since the epoch) or this long ago (90, 10m, 2h, 1d)")
    ] = None,
    tail: Annotated[int | None, typer.Option(min=0, help="the last N lines only")] = None,
    tenant: Annotated[str | None, typer.Option(
        help="the job's tenant (an admin's); JOB may also be written TENANT/JOB")] = None,
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """A job's output (each rank's stdout and stderr), kept after the job ends
    and after its node is gone. Exit 1 when there is no such job."""
    try:
        owner, job_id = jobctl.refs([job_ref], tenant)[0]
    except jobctl.Selection as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    def show(client: GatewayClient) -> None:
        lines = client.log_lines(job_id, tenant=owner, rank=rank, since=since, tail=tail,
                                 follow=follow)
        for text in render_lines(lines, one_rank=rank is not None):
            typer.echo(text)

    gateway_call(gateway, token, config, show)
