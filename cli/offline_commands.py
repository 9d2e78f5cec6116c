"""``hops plan`` and ``hops simulate``: the scheduling core on this machine,
with no live system: one round planned for the jobs of a file, or one
policy simulated over a workload (:mod:`simulator`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec
import typer

from cli.up_command import POLICY_HELP
from scheduling.registry import DEFAULT_POLICY
from scheduling.rounds import ROUND_S
from shared.specs import SpecError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEFAULT_CLUSTER = EXAMPLES / "cluster-paper-physical.yaml"
DEFAULT_JOBS = EXAMPLES / "jobs-demo.yaml"
DEFAULT_PROFILES = EXAMPLES / "profiles-demo.yaml"


def plan(
    cluster: Annotated[Path, typer.Option(help="cluster spec")] = DEFAULT_CLUSTER,
    jobs: Annotated[Path, typer.Option(help="job specs")] = DEFAULT_JOBS,
    profiles: Annotated[Path, typer.Option(help="profiled time modules")] = DEFAULT_PROFILES,
    policy: Annotated[str, typer.Option(help=POLICY_HELP)] = DEFAULT_POLICY,
    priority: Annotated[str | None, typer.Option(help="lr, ftf, las, sjf, srtf or fifo")] = None,
    lam: Annotated[float | None, typer.Option(help="lambda of Eq. (11); inf: greedy order")
                   ] = None,
    sigma: Annotated[float | None, typer.Option(help="sensitivity threshold")] = None,
    gap: Annotated[float | None, typer.Option(help="relative MIP gap")] = None,
    now: Annotated[float | None, typer.Option(help="plan time, s")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Plan one round for the jobs in a file, with their profiles; --priority,
    --lam, --sigma and --gap set that setting of the policy."""
    from cli.oneshot import plan_once, render_plan
    from scheduling.registry import make_policy, resolve

    try:
        spec = resolve(policy, priority=priority, lam=lam, sigma=sigma, mip_rel_gap=gap)
        snap, result = plan_once(cluster, jobs, profiles, make_policy(spec), now)
    except (SpecError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(msgspec.json.encode(result).decode())
    else:
        typer.echo(render_plan(snap, result))


def simulate(
    cluster: Annotated[str, typer.Option(help="paper-physical, paper-sim-512, gavel or a file")],
    workload: Annotated[str, typer.Option(help="paper-physical, paper-sim, or a file/trace")],
    out: Annotated[Path, typer.Option(help="output folder")],
    policy: Annotated[str, typer.Option(help=POLICY_HELP)] = DEFAULT_POLICY,
    priority: Annotated[str | None, typer.Option(help="lr, ftf, las, sjf, srtf or fifo")] = None,
    lam: Annotated[float | None, typer.Option(help="the policy's lambda")] = None,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    first_n: Annotated[int | None, typer.Option(help="take the first N jobs")] = None,
    compress: Annotated[float, typer.Option(help="divide inter-arrival times by this")] = 1.0,
    elastic: Annotated[bool, typer.Option(help="derive elastic requirement sets (traces)")] = False,
    rate: Annotated[float | None, typer.Option(help="arrivals per hour (paper-sim)")] = None,
    round_s: Annotated[float, typer.Option(help="round length, s")] = ROUND_S,
    restart_s: Annotated[float | None, typer.Option(
        help="checkpoint-restart cost of every job, s (default: each model's own, "
        "Sia's measured penalties)")] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Simulate one policy on one workload; writes OUT/summary.json, jobs.csv, rounds.csv."""
    from experiments.common.simrun import RunSpec, rich_progress, write_outputs
    from experiments.common.simrun import simulate as run

    spec = RunSpec(
        cluster=cluster, workload=workload, policy=policy, priority=priority, lam=lam,
        seed=seed, first_n=first_n, compress=compress, elastic=elastic, rate_per_h=rate,
        round_s=round_s, restart_s=restart_s,
    )
    label = f"{policy}/{priority}" if priority else policy
    update, close = rich_progress(label) if progress else (None, lambda: None)
    try:
        c, result = run(spec, update)
    except (SpecError, ValueError) as exc:
        close()
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    close()
    summary = write_outputs(out, spec, c, result)
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "run"}, indent=2))
