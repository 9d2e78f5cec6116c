"""``hops nodes``: the registered servers, and their removal, drain and
undrain (``hops nodes enrol`` lives in :mod:`cli.auth`). :mod:`cli.main`
adds :data:`nodes_app` to the ``hops`` app."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.gateway_opts import ConfigOpt, GatewayOpt, JsonOpt, TokenOpt, gateway_call, one_request

nodes_app = typer.Typer(
    help="The registered servers (`hops nodes`), their drain, removal and enrolment.")


@nodes_app.callback(invoke_without_command=True)
def nodes(ctx: typer.Context, gateway: GatewayOpt = None, token: TokenOpt = None,
          config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The registered servers, their GPUs and the jobs holding them."""
    from cli.tables import render_nodes

    if ctx.invoked_subcommand is not None:
        return
    body = gateway_call(gateway, token, config, lambda c: c.cluster())
    typer.echo(json.dumps(body, indent=2) if as_json else render_nodes(body))


@nodes_app.command("remove")
def nodes_remove(
    server_id: Annotated[str, typer.Argument(help="the server's id")],
    force: Annotated[bool, typer.Option(
        "--force", help="remove it even though it is alive (its jobs are requeued)")] = False,
    reason: Annotated[str, typer.Option(help="why (logged by the monitor)")] = "",
    gateway: GatewayOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Remove a node: a lost one, or an alive one with --force. It comes back
    when its executor registers again. Exit 1 if the monitor refuses."""
    one_request(gateway, token, config, server_id, "removed",
                lambda c: c.remove_node(server_id, force, reason))


@nodes_app.command("drain")
def nodes_drain(
    server_id: Annotated[str, typer.Argument(help="the server's id")],
    move: Annotated[bool, typer.Option(
        "--move", help="stop its running jobs with a checkpoint at the next round and "
        "run them elsewhere (default: they finish there)")] = False,
    reason: Annotated[str, typer.Option(help="why (logged by the monitor)")] = "",
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """Drain a node: no new work goes there until `hops nodes undrain`; a
    restart or re-registration keeps it drained. Exit 1 if refused."""
    one_request(gateway, token, config, server_id,
                "drained, its jobs move" if move else "drained",
                lambda c: c.drain_node(server_id, move=move, reason=reason))


@nodes_app.command("undrain")
def nodes_undrain(
    server_id: Annotated[str, typer.Argument(help="the server's id")],
    reason: Annotated[str, typer.Option(help="why (logged by the monitor)")] = "",
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """Undrain a node: it takes new work at the next plan. Exit 1 if refused."""
    one_request(gateway, token, config, server_id, "undrained",
                lambda c: c.drain_node(server_id, drain=False, reason=reason))
