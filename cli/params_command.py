"""``hops params JOB --out FILE``: a Hare task job's final parameters, as
its aggregator saved them once its last round was applied, read through
``GET /jobs/{id}/params`` (:mod:`gateway.params_routes`) and written to FILE
byte for byte; ``hops.aggregator.codec.decode_params`` reads them back into
the model's named tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli import jobctl
from cli.gateway_opts import ConfigOpt, GatewayOpt, TokenOpt, gateway_call


def params(
    job_ref: Annotated[str, typer.Argument(metavar="JOB", help="the job's id, or TENANT/ID")],
    out: Annotated[Path, typer.Option("--out", "-o", help="the file to write them to",
                                      dir_okay=False, writable=True)],
    tenant: Annotated[str | None, typer.Option(
        help="the job's tenant (an admin's); JOB may also be written TENANT/JOB")] = None,
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """A task job's final parameters, to a file. Exit 1 when there is no such
    job or it has none (`no_final_params`: not a task job, or not finished)."""
    try:
        owner, job_id = jobctl.refs([job_ref], tenant)[0]
    except jobctl.Selection as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    data = gateway_call(gateway, token, config,
                        lambda client: client.final_params(job_id, tenant=owner))
    out.write_bytes(data)
    typer.echo(f"{job_ref}: {len(data)} bytes of final parameters written to {out}")
