"""``hops signatures`` and ``hops signatures reprofile``: the commands over
:mod:`cli.signatures`. :mod:`cli.main` adds :data:`signatures_app` to the
``hops`` app."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.client import Answer, GatewayClient
from cli.gateway_opts import ConfigOpt, GatewayOpt, JsonOpt, TokenOpt, gateway_call

signatures_app = typer.Typer(
    help="Profile signatures and their shared profiles (`hops signatures`), and profiling "
    "one again (`hops signatures reprofile`). Admins only.")


@signatures_app.callback(invoke_without_command=True)
def signatures(ctx: typer.Context, gateway: GatewayOpt = None, token: TokenOpt = None,
               config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Each profile signature: model, batch size, the GPU types it holds a
    current shared profile of, the stale ones, and its jobs not ended."""
    from cli import signatures as sig

    if ctx.invoked_subcommand is None:
        body = gateway_call(gateway, token, config, GatewayClient.signatures)
        typer.echo(json.dumps(body, indent=2) if as_json else sig.render_signatures(body))


@signatures_app.command("reprofile")
def signatures_reprofile(
    signature: Annotated[str | None, typer.Argument(help="the signature (see `hops signatures`)")
                         ] = None,
    job: Annotated[str | None, typer.Option(
        "--job", help="the signature of this job ([TENANT/]ID)")] = None,
    gpu_type: Annotated[list[str] | None, typer.Option(
        "--type", help="only this GPU type (repeatable; default: every type)")] = None,
    reason: Annotated[str, typer.Option(help="why (logged by the gateway)")] = "",
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Mark a signature's shared profiles stale: its next job is profiled
    again on those types (jobs past profiling keep their estimates). Give
    SIGNATURE or --job. Exit 1 if refused (404: no shared profile of it),
    2 for bad arguments."""
    from cli import signatures as sig

    if (signature is None) == (job is None):
        typer.echo("error: give a SIGNATURE or --job JOB (one of them)", err=True)
        raise typer.Exit(2)

    def call(client: GatewayClient) -> tuple[str, Answer]:
        target = signature or sig.job_signature(client, str(job))
        return target, client.reprofile_signature(target, gpu_type or [], reason)

    try:
        target, answer = gateway_call(gateway, token, config, call)
    except sig.SignatureNotFound as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(answer.body, indent=2) if as_json
               else sig.render_reprofile(target, answer))
    if not answer.ok:
        raise typer.Exit(1)
