"""The ``hops`` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer

from services.scheduler.planner import HopsSettings
from shared.snapshot import Plan, Snapshot
from shared.specs import SpecError

app = typer.Typer(
    help="Hops: heterogeneity-aware, latency-ratio-fair DL cluster scheduling.",
    no_args_is_help=True,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEFAULT_CLUSTER = EXAMPLES / "cluster-paper-physical.yaml"
DEFAULT_JOBS = EXAMPLES / "jobs-demo.yaml"
DEFAULT_PROFILES = EXAMPLES / "profiles-demo.yaml"


@app.command()
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as _v

    typer.echo(_v("hops-scheduler"))


@app.command()
def plan(
    cluster: Annotated[Path, typer.Option(help="cluster spec")] = DEFAULT_CLUSTER,
    jobs: Annotated[Path, typer.Option(help="job specs")] = DEFAULT_JOBS,
    profiles: Annotated[Path, typer.Option(help="profiled time modules")] = DEFAULT_PROFILES,
    priority: Annotated[str, typer.Option(help="lr, ftf, las, sjf, srtf or fifo")] = "lr",
    lam: Annotated[float, typer.Option(help="lambda of Eq. (11); inf = greedy order")] = 1.0,
    sigma: Annotated[float, typer.Option(help="sensitivity threshold")] = 1.4,
    gap: Annotated[float, typer.Option(help="relative MIP gap")] = 0.01,
    now: Annotated[float | None, typer.Option(help="plan time, s")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Plan one round for the jobs in a file, with their profiles."""
    from hops.oneshot import plan_once

    settings = HopsSettings(priority=priority, lam=lam, sigma=sigma, mip_rel_gap=gap)
    try:
        snap, result = plan_once(cluster, jobs, profiles, settings, now)
    except (SpecError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(msgspec.json.encode(result).decode())
    else:
        typer.echo(render_plan(snap, result))


def render_plan(snap: Snapshot, result: Plan) -> str:
    """A human-readable plan: assignments in priority order, then the reasons."""
    r = result.reasons
    held = {a.job_id: a for a in result.assignments}
    lines = [
        f"cluster {snap.cluster.name}: {snap.cluster.total_gpus} GPUs on "
        f"{len(snap.cluster.servers)} servers; {len(snap.jobs)} jobs; policy {r.policy}",
        "",
        f"{'job':<22} {'priority':>9} {'gpus':>5} {'samples/s':>10}  configuration",
    ]
    for jid in sorted(r.priorities, key=lambda j: -r.priorities[j]):
        a = held.get(jid)
        where = str(a.config) if a else "waits"
        gpus = str(a.config.total_gpus) if a else "-"
        tput = f"{a.throughput:10.1f}" if a else f"{'-':>10}"
        lines.append(f"{jid:<22} {r.priorities[jid]:9.3f} {gpus:>5} {tput}  {where}")
    used = sum(a.config.total_gpus for a in result.assignments)
    lines += ["", f"GPUs used {used}/{snap.cluster.total_gpus}; window {len(r.window)} jobs"]
    if r.admitted_by_adjustment:
        lines.append(f"admitted by sensitivity adjustment: {', '.join(r.admitted_by_adjustment)}")
    for i, p in enumerate(r.passes):
        lines.append(
            f"pass {i} ({p.kind}, {p.formulation}): {p.jobs} jobs, {p.variables} columns, "
            f"objective {p.objective:.4f}, bound {p.bound:.4f}, gap {p.gap:.2%}, "
            f"{p.solve_s * 1000:.1f} ms, {p.status}"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    app()
