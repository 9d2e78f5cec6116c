"""The ``hops`` command."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from cli import auth as cli_auth
from cli import experiment_command as cli_experiment
from cli import logs_command as cli_logs
from cli import offline_commands as cli_offline
from cli import params_command as cli_params
from cli import policies as cli_policies
from cli import up_command as cli_up
from cli.client import GatewayClient
from cli.gateway_opts import (
    ConfigOpt,
    GatewayOpt,
    JsonOpt,
    TokenOpt,
    gateway_call,
    one_request,
)
from cli.jobs_view import SORT_HELP, check_sort, sort_jobs
from cli.nodes_command import nodes_app
from cli.signatures_command import signatures_app
from cli.tenants_command import tenants_app
from shared.job import JobSpec
from shared.specs import SpecError

app = typer.Typer(
    help="Hops: heterogeneity-aware, latency-ratio-fair DL cluster scheduling.",
    no_args_is_help=True,
)

@app.command()
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as _v

    typer.echo(_v("hops-scheduler"))


# --- the live system -----------------------------------------------------------------

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
    rejected = gateway_call(gateway, token, config, lambda c: _send(c, checked.valid))
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
    from cli.client import JobsQuery
    from cli.tables import render_jobs

    try:
        check_sort(sort)
    except ValueError as exc:  # refused before asking the gateway anything
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    query = JobsQuery(phase=phase, tenant=tenant, limit=limit)
    body = gateway_call(gateway, token, config, lambda c: c.jobs(query))
    body["jobs"] = sort_jobs(body.get("jobs", []), sort)
    typer.echo(json.dumps(body, indent=2) if as_json else render_jobs(body))


@app.command()
def queue(gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
          as_json: JsonOpt = False) -> None:
    """The waiting jobs in priority order, as the scheduler leader sees them."""
    from cli.tables import render_queue

    body = gateway_call(gateway, token, config, lambda c: c.queue())
    typer.echo(json.dumps(body, indent=2) if as_json else render_queue(body))


# The sub-apps live in modules of their own; added here, in the order of `hops --help`.
app.add_typer(tenants_app, name="tenants")
app.add_typer(nodes_app, name="nodes")


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
    from cli.tables import render_jobs

    owner, job_id = _ref(job_ref, tenant)
    body = gateway_call(gateway, token, config, lambda c: c.job(job_id, tenant=owner))
    typer.echo(json.dumps(body, indent=2) if as_json else render_jobs({"jobs": [body]}))


@app.command()
def describe(
    job_ref: JobArg, tenant: TenantOpt = None, as_json: JsonOpt = False,
    limit: Annotated[int | None, typer.Option(
        min=1, help="timeline entries at most (default: the gateway's, 256)")] = None,
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """One job in full: spec, tenant, placement, throughput estimated against
    measured, why it waits, its forecast with the 10th-90th percentile
    interval and what-if alternatives, its last stop, its conditions and its
    timeline. Exit 1 when there is no such job."""
    import time

    from cli.describe import render_describe

    owner, job_id = _ref(job_ref, tenant)
    body, timeline = gateway_call(gateway, token, config,
                                  lambda c: _described(c, job_id, owner, limit))
    if as_json:
        typer.echo(json.dumps({"job": body, "timeline": timeline}, indent=2))
    else:
        typer.echo(render_describe(body, timeline, time.time()))


def _described(client: GatewayClient, job_id: str, tenant: str | None, limit: int | None
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The job, and its timeline (None from a gateway that serves none)."""
    from cli.client import GatewayError

    body = client.job(job_id, tenant=tenant)
    try:
        return body, client.timeline(job_id, tenant=tenant, limit=limit)
    except GatewayError as exc:
        if exc.status != 404:
            raise
        return body, None


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
        one_request(gateway, token, config, ids[0], "cancelled",
                    lambda c: c.cancel(job_id, reason, tenant=owner))
        return
    refused = gateway_call(gateway, token, config, lambda c: _bulk_cancel(
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
    one_request(gateway, token, config, job_ref, "held",
                lambda c: c.hold(job_id, reason, tenant=owner))


@app.command()
def release(
    job_ref: JobArg, tenant: TenantOpt = None,
    gateway: GatewayOpt = None, token: TokenOpt = None, config: ConfigOpt = None,
) -> None:
    """Release a held job: it is planned again. Exit 1 if the scheduler refuses."""
    owner, job_id = _ref(job_ref, tenant)
    one_request(gateway, token, config, job_ref, "released",
                lambda c: c.hold(job_id, release=True, tenant=owner))


app.add_typer(signatures_app, name="signatures")


# The credentials commands live in cli/auth.py, `hops up` in cli/up_command.py;
# registered here.
nodes_app.command("enrol")(cli_auth.nodes_enrol)
app.command()(cli_auth.credentials)
app.command()(cli_up.up)
app.command()(cli_policies.policies)
app.command()(cli_offline.plan)
app.command()(cli_offline.simulate)
app.command()(cli_experiment.experiment)
app.command()(cli_logs.logs)
app.command()(cli_params.params)


if __name__ == "__main__":  # pragma: no cover
    app()
