"""The ``hops`` command."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from cli import auth as cli_auth
from cli import experiment_command as cli_experiment
from cli import offline_commands as cli_offline
from cli import policies as cli_policies
from cli import up_command as cli_up
from cli.client import Answer, GatewayClient
from cli.config import DEFAULT_GATEWAY
from cli.jobs_view import SORT_HELP, check_sort, sort_jobs
from shared.job import JobSpec
from shared.specs import SpecError

app = typer.Typer(
    help="Hops: heterogeneity-aware, latency-ratio-fair DL cluster scheduling.",
    no_args_is_help=True,
)

T = TypeVar("T")



@app.command()
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as _v

    typer.echo(_v("hops-scheduler"))


# --- the live system -----------------------------------------------------------------

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


def _gateway_call(gateway: str | None, token: str | None, config: str | None,
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


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="jobs file (YAML, TOML or JSON)")],
    skip_invalid: Annotated[bool, typer.Option(
        "--skip-invalid", help="send the valid jobs even if some are invalid (still exit 1)"
    )] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="check the whole file, send nothing"
    )] = False,
    gateway: GatewayOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Submit every job of a jobs file; one line per job.

    The whole file is checked first: each invalid job gets one line (index,
    id, field, problem) and, unless --skip-invalid, nothing is sent. Exit 1 if
    any job was invalid or rejected, 2 if the file cannot be read."""
    from cli.jobfile import check_jobs

    try:
        checked = check_jobs(file)
    except SpecError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for bad in checked.invalid:
        typer.echo(bad.line(checked.source), err=True)
    held = bool(checked.invalid) and not skip_invalid
    if dry_run or held:
        typer.echo(_nothing_sent(len(checked.valid), len(checked.invalid), dry_run), err=True)
        raise typer.Exit(1 if checked.invalid else 0)
    rejected = _gateway_call(gateway, token, config, lambda c: _send(c, checked.valid))
    if checked.invalid:
        typer.echo(f"{len(checked.invalid)} invalid jobs were not sent", err=True)
    if rejected or checked.invalid:
        raise typer.Exit(1)


def _nothing_sent(valid: int, invalid: int, dry_run: bool) -> str:
    if not invalid:
        return f"all {valid} jobs are valid; nothing sent (--dry-run)"
    skip = "" if dry_run else f"; --skip-invalid sends the {valid} valid ones"
    return f"{invalid} of {valid + invalid} jobs are invalid; nothing sent{skip}"


def _send(client: GatewayClient, specs: Sequence[JobSpec]) -> int:
    """Submit each spec, one line each; how many the scheduler rejected."""
    from cli.client import render_answer

    rejected = 0
    for spec in specs:
        answer = client.submit(spec)
        typer.echo(render_answer(spec.id, answer))
        rejected += not answer.ok
    return rejected


@app.command()
def jobs(
    phase: Annotated[str | None, typer.Option(help="only jobs in this phase")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's jobs")] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, help="show at most this many (default: every job, page after page)"
    )] = None,
    sort: Annotated[str, typer.Option(help=SORT_HELP)] = "submitted",
    gateway: GatewayOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the jobs the scheduler knows (oldest first unless --sort says
    otherwise): tenant, phase, progress, GPUs, when submitted, how long it
    waited and ran, restarts and the reason it waits or ended."""
    from cli.client import JobsQuery, render_jobs

    try:
        check_sort(sort)
    except ValueError as exc:  # refused before asking the gateway anything
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    query = JobsQuery(phase=phase, tenant=tenant, limit=limit)
    body = _gateway_call(gateway, token, config, lambda c: c.jobs(query))
    body["jobs"] = sort_jobs(body.get("jobs", []), sort)
    typer.echo(json.dumps(body, indent=2) if as_json else render_jobs(body))


@app.command()
def queue(gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
          as_json: JsonOpt = False) -> None:
    """The waiting jobs in priority order, as the scheduler leader sees them."""
    from cli.client import render_queue

    body = _gateway_call(gateway, token, config, lambda c: c.queue())
    typer.echo(json.dumps(body, indent=2) if as_json else render_queue(body))


tenants_app = typer.Typer(help="The tenants' virtual clusters (`hops tenants`), and "
                          "reloading the tenants file (`hops tenants reload`).")
app.add_typer(tenants_app, name="tenants")


@tenants_app.callback(invoke_without_command=True)
def tenants(ctx: typer.Context, gateway: GatewayOpt = None, token: TokenOpt = None,
            config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Each tenant's virtual cluster: its cells per chain and level, the servers
    they are bound to, used and free GPUs and opportunistic use (a tenant's
    token shows only its own)."""
    from cli.tenants_view import render_tenants

    if ctx.invoked_subcommand is not None:
        return
    body = _gateway_call(gateway, token, config, lambda c: c.tenants())
    typer.echo(json.dumps(body, indent=2) if as_json else render_tenants(body))


@tenants_app.command("reload")
def tenants_reload(gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
                   as_json: JsonOpt = False) -> None:
    """Reload the tenants file (HOPS_TENANTS) without a restart: the gateway
    and every scheduler replica read it again and check it as at start; one
    line per process. Admins only. Exit 1 if any refused it (it keeps the old
    file) or no scheduler answered."""
    from cli.tenants_view import render_reload

    answer = _gateway_call(gateway, token, config, lambda c: c.reload_tenants())
    typer.echo(json.dumps(answer.body, indent=2) if as_json else render_reload(answer.body))
    if not answer.ok:
        raise typer.Exit(1)


nodes_app = typer.Typer(
    help="The registered servers (`hops nodes`), their drain, removal and enrolment.")
app.add_typer(nodes_app, name="nodes")


@nodes_app.callback(invoke_without_command=True)
def nodes(ctx: typer.Context, gateway: GatewayOpt = None, token: TokenOpt = None,
          config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The registered servers, their GPUs and the jobs holding them."""
    from cli.client import render_nodes

    if ctx.invoked_subcommand is not None:
        return
    body = _gateway_call(gateway, token, config, lambda c: c.cluster())
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
    _one(gateway, token, config, server_id, "removed",
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
    _one(gateway, token, config, server_id, "drained, its jobs move" if move else "drained",
         lambda c: c.drain_node(server_id, move=move, reason=reason))


@nodes_app.command("undrain")
def nodes_undrain(
    server_id: Annotated[str, typer.Argument(help="the server's id")],
    reason: Annotated[str, typer.Option(help="why (logged by the monitor)")] = "",
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """Undrain a node: it takes new work at the next plan. Exit 1 if refused."""
    _one(gateway, token, config, server_id, "undrained",
         lambda c: c.drain_node(server_id, drain=False, reason=reason))


# ``--tenant`` of the one-job commands.
TenantOpt = Annotated[str | None, typer.Option(
    help="the job's tenant (an admin's; a tenant's token names its own jobs by id); "
         "JOB may also be written TENANT/JOB")]
JobArg = Annotated[str, typer.Argument(metavar="JOB", help="the job's id, or TENANT/ID")]


def _ref(job: str, tenant: str | None) -> tuple[str | None, str]:
    """The job a command names (``id``, ``tenant/id``, ``--tenant``); exit 2
    when ``tenant/id`` and ``--tenant`` disagree."""
    from cli import jobctl

    try:
        return jobctl.refs([job], tenant)[0]
    except jobctl.Selection as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def job(
    job_ref: JobArg, tenant: TenantOpt = None, as_json: JsonOpt = False,
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """One job: its line of `hops jobs`, or (--json) its whole record. Exit 1
    when there is no such job (another tenant's job is no job of yours)."""
    from cli.client import render_jobs

    owner, job_id = _ref(job_ref, tenant)
    body = _gateway_call(gateway, token, config, lambda c: c.job(job_id, tenant=owner))
    typer.echo(json.dumps(body, indent=2) if as_json else render_jobs({"jobs": [body]}))


@app.command()
def cancel(
    job_ids: Annotated[list[str] | None, typer.Argument(
        metavar="[JOB]...", help="the jobs: ids, or TENANT/ID")] = None,
    tenant: Annotated[str | None, typer.Option(
        help="every job of this tenant; with ids, the tenant they are of")] = None,
    phase: Annotated[str | None, typer.Option(help="every job in this phase")] = None,
    every: Annotated[bool, typer.Option("--all", help="every job that has not ended")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask to confirm")] = False,
    reason: Annotated[str, typer.Option(help="why (kept with the job)")] = "",
    gateway: GatewayOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Cancel jobs (waiting or running): one id, or many ids or filters, which
    list the jobs and ask to confirm the count. Exit 1 if any is refused."""
    from cli import jobctl

    ids = job_ids or []
    try:
        jobctl.check_filters(ids, tenant, phase, every)
        named = jobctl.refs(ids, tenant)
    except jobctl.Selection as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if len(named) == 1:
        owner, job_id = named[0]
        _one(gateway, token, config, ids[0], "cancelled",
             lambda c: c.cancel(job_id, reason, tenant=owner))
        return
    refused = _gateway_call(gateway, token, config, lambda c: _bulk_cancel(
        c, named or jobctl.matching(c, tenant, phase), reason, yes))
    if refused:
        raise typer.Exit(1)


def _bulk_cancel(client: GatewayClient, ids: list[tuple[str | None, str]], reason: str,
                 yes: bool) -> int:
    from cli import jobctl

    if not ids:
        typer.echo("no job matches")
        return 0
    typer.echo(jobctl.listing(ids))
    if not yes:
        if not sys.stdin.isatty():
            typer.echo("error: not a terminal to confirm on; pass --yes to cancel them", err=True)
            raise typer.Exit(2)
        typer.confirm(f"cancel {len(ids)} jobs?", abort=True)
    return jobctl.cancel_each(client, ids, reason, typer.echo)


@app.command()
def hold(
    job_ref: JobArg,
    reason: Annotated[str, typer.Option(help="why (shown as its reason)")] = "",
    tenant: TenantOpt = None,
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """Hold a waiting job: it is in no plan until `hops release` (a running
    job cannot be held: not_pending). Exit 1 if the scheduler refuses."""
    owner, job_id = _ref(job_ref, tenant)
    _one(gateway, token, config, job_ref, "held",
         lambda c: c.hold(job_id, reason, tenant=owner))


@app.command()
def release(
    job_ref: JobArg, tenant: TenantOpt = None,
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """Release a held job: it is planned again. Exit 1 if the scheduler refuses."""
    owner, job_id = _ref(job_ref, tenant)
    _one(gateway, token, config, job_ref, "released",
         lambda c: c.hold(job_id, release=True, tenant=owner))


def _one(gateway: str | None, token: str | None, config: str | None, job_id: str, verb: str,
         call: Callable[[GatewayClient], Answer]) -> None:
    """One job's request, its answer on one line; exit 1 when refused."""
    from cli.client import render_answer

    answer = _gateway_call(gateway, token, config, call)
    typer.echo(render_answer(job_id, answer, verb=verb))
    if not answer.ok:
        raise typer.Exit(1)


signatures_app = typer.Typer(
    help="Profile signatures and their shared profiles (`hops signatures`), and profiling "
    "one again (`hops signatures reprofile`). Admins only.")
app.add_typer(signatures_app, name="signatures")


@signatures_app.callback(invoke_without_command=True)
def signatures(ctx: typer.Context, gateway: GatewayOpt = None, token: TokenOpt = None,
               config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Each profile signature: model, batch size, the GPU types it holds a
    current shared profile of, the stale ones, and its jobs not ended."""
    from cli import signatures as sig

    if ctx.invoked_subcommand is None:
        body = _gateway_call(gateway, token, config, sig.signatures)
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
        return target, sig.reprofile(client, target, gpu_type or [], reason)

    try:
        target, answer = _gateway_call(gateway, token, config, call)
    except sig.SignatureNotFound as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(answer.body, indent=2) if as_json
               else sig.render_reprofile(target, answer))
    if not answer.ok:
        raise typer.Exit(1)


# The credentials commands live in cli/auth.py, `hops up` in cli/up_command.py;
# registered here.
nodes_app.command("enrol")(cli_auth.nodes_enrol)
app.command()(cli_auth.credentials)
app.command()(cli_up.up)
app.command()(cli_policies.policies)
app.command()(cli_offline.plan)
app.command()(cli_offline.simulate)
app.command()(cli_experiment.experiment)


if __name__ == "__main__":  # pragma: no cover
    app()
