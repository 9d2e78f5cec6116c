"""``hops nodes enrol`` and ``hops credentials``: the credentials folder
from the command line (cli/up/credentials.py, docs/security.md). Registered
on the ``hops`` app by :mod:`cli.main`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shared.specs import SpecError


def nodes_enrol(
    server_id: Annotated[str, typer.Argument(help="the server's id")],
    data_dir: Annotated[Path, typer.Option(help="the data folder of `hops up`")] = Path(".hops"),
) -> None:
    """Issue the NATS credential of an executor on another host (kept if it
    exists), admit it in nats-server and reload a running one. Copy the
    printed file to that host (mode 0600) and start its executor with
    HOPS_NATS_NKEY pointing at it."""
    from cli.up.credentials import CredentialsError, enrol, reload_nats
    from cli.up.stack import StackConfig
    from services.runtime.identity import IdentityError

    config = StackConfig(data_dir=data_dir)
    try:
        seed = enrol(config.credentials_dir, server_id)
    except (CredentialsError, IdentityError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{seed}")
    typer.echo(reload_nats(config.state_file), err=True)


def credentials(
    out: Annotated[Path, typer.Option(help="folder to write them to (e.g. secrets/)")],
    cluster: Annotated[str, typer.Option(help="the cluster whose executors get one each")] = (
        "paper-physical"
    ),
    tenants: Annotated[Path | None, typer.Option(help="tenants file")] = None,
    compose: Annotated[bool, typer.Option(
        "--compose", help="files readable by the containers' user (the folder stays 0700)"
    )] = False,
) -> None:
    """Generate (or complete) a credentials folder, as `hops up` does in its
    data folder: for compose's secrets (`hops credentials --out secrets/ --compose`)."""
    from cli.up.credentials import CredentialsError, prepare
    from scheduling.live.cells import cluster_nodes, tenant_cells
    from services.runtime.identity import IdentityError
    from shared.tenants import TenantsError, load_tenants
    from world.clusters import cluster_arg

    try:
        file = load_tenants(tenants.read_text()) if tenants is not None else None
        spec = cluster_arg(cluster)
        if file is not None:  # the cells, against the cluster compose runs
            tenant_cells(file, cluster_nodes(spec), str(tenants))
        servers = [s.id for s in spec.servers]
        creds = prepare(out, servers, file, 0o644 if compose else 0o600)
    except (OSError, SpecError, TenantsError, CredentialsError, IdentityError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"credentials in {creds.dir}/ (admin token: {creds.dir}/admin.token)")
