"""The options every command of the live system takes (``--gateway``,
``--token``, ``--config``, ``--json``) and the call that turns them into a
client of the gateway (:func:`gateway_call`), shared by :mod:`cli.main` and
the sub-apps it adds (:mod:`cli.nodes_command`, :mod:`cli.tenants_command`,
:mod:`cli.signatures_command`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from cli.client import Answer, GatewayClient
from cli.config import DEFAULT_GATEWAY

T = TypeVar("T")

GatewayOpt = Annotated[str | None, typer.Option(
    "--gateway", envvar="HOPS_GATEWAY_URL",
    help=f"the gateway's URL (else the config file's, else {DEFAULT_GATEWAY})",
)]
TokenOpt = Annotated[str | None, typer.Option(
    "--token", envvar="HOPS_TOKEN", help="bearer token (else the config file's)",
)]
ConfigOpt = Annotated[str | None, typer.Option(
    "--config", envvar="HOPS_CONFIG", help="CLI config file with gateway and token "
    "(default .hops/cli.yaml, which `hops up` writes)",
)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the gateway's JSON")]


def gateway_call(gateway: str | None, token: str | None, config: str | None,
                 call: Callable[[GatewayClient], T]) -> T:
    """``call`` on a client of the gateway the flags, the environment or the
    config file name (:mod:`cli.config`); a failure (a 401 included)
    becomes one line and exit 1, a config file that cannot be used exit 2."""
    from cli.client import GatewayError, GatewayUnreachable
    from cli.config import ConfigError, target

    try:
        found = target(gateway, token, config, os.environ)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        with GatewayClient(found.gateway, token=found.token) as client:
            return call(client)
    except (GatewayUnreachable, GatewayError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def one_request(gateway: str | None, token: str | None, config: str | None, name: str,
                verb: str, call: Callable[[GatewayClient], Answer]) -> None:
    """One request about one job or node (``name``), its answer on one line;
    exit 1 when refused."""
    from cli.client import render_answer

    answer = gateway_call(gateway, token, config, call)
    typer.echo(render_answer(name, answer, verb=verb))
    if not answer.ok:
        raise typer.Exit(1)
