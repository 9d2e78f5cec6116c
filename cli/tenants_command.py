"""``hops tenants``: the tenants' virtual clusters, and ``hops tenants
reload``, which applies a changed tenants file without a restart (the
tables are :mod:`cli.tenants_view`'s). :mod:`cli.main` adds
:data:`tenants_app` to the ``hops`` app."""

from __future__ import annotations

import json

import typer

from cli.gateway_opts import ConfigOpt, GatewayOpt, JsonOpt, TokenOpt, gateway_call

tenants_app = typer.Typer(help="The tenants' virtual clusters (`hops tenants`), and "
                          "reloading the tenants file (`hops tenants reload`).")


@tenants_app.callback(invoke_without_command=True)
def tenants(ctx: typer.Context, gateway: GatewayOpt = None, token: TokenOpt = None,
            config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Each tenant's virtual cluster: its cells per chain and level, the servers
    they are bound to, used and free GPUs and opportunistic use (a tenant's
    token shows only its own)."""
    from cli.tenants_view import render_tenants

    if ctx.invoked_subcommand is not None:
        return
    body = gateway_call(gateway, token, config, lambda c: c.tenants())
    typer.echo(json.dumps(body, indent=2) if as_json else render_tenants(body))


@tenants_app.command("reload")
def tenants_reload(gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
                   as_json: JsonOpt = False) -> None:
    """Reload the tenants file (HOPS_TENANTS) without a restart: the gateway
    and every scheduler replica read it again and check it as at start; one
    line per process. Admins only. Exit 1 if any refused it (it keeps the old
    file) or no scheduler answered."""
    from cli.tenants_view import render_reload

    answer = gateway_call(gateway, token, config, lambda c: c.reload_tenants())
    typer.echo(json.dumps(answer.body, indent=2) if as_json else render_reload(answer.body))
    if not answer.ok:
        raise typer.Exit(1)
