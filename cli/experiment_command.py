"""``hops experiment NAME``: runs one experiment of the catalog
(:mod:`experiments.catalog`, one folder each under ``experiments/``). The
experiments are an extra (matplotlib): they are imported only when the
command runs, so the CLI works in the service image without them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shared.specs import SpecError

if TYPE_CHECKING:
    from experiments.catalog import Entry

EXPERIMENTS_HELP = ("table3, table4, priorities, arrival-rates, elasticflow, traces (the four "
                    "ElasticFlow traces at a set load), sharing, coda, cell-fragmentation or hare")


# typer reads every option from the signature, so this command is long by
# its declarations alone: its body is the few lines below them.
def experiment(
    name: Annotated[str, typer.Argument(help=EXPERIMENTS_HELP)],
    out: Annotated[Path, typer.Option(help="output folder")],
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    trace: Annotated[str | None, typer.Option(
        help="trace for 'elasticflow'; traces, comma-separated, for 'traces'")] = None,
    first_n: Annotated[int | None, typer.Option(help="first N jobs of the trace")] = None,
    compress: Annotated[float, typer.Option(help="inter-arrival compression")] = 1.0,
    rates: Annotated[str, typer.Option(help="arrival rates per hour, comma-separated")] = (
        "30,60,120,300,600,1200"
    ),
    policy: Annotated[list[str] | None, typer.Option(
        help="a policy spec to compare, repeatable (default: hops, sia and gavel, and "
        "for traces and table4 slurm, tiresias and themis too; for hare: its six task policies "
        "and hops)")] = None,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
    traces: Annotated[str | None, typer.Option(
        help="'sharing': traces, comma-separated, one tenant each or with a tenant column "
        "(default: the four ElasticFlow traces)")] = None,
    inner: Annotated[str, typer.Option(
        help="'sharing', 'coda': the inner policy")] = "hops:lam=inf",
    workers: Annotated[int, typer.Option(
        help="the experiment's independent simulations run at once, in this many local "
        "processes (1: one after another; the results are the same)")] = 1,
    ray: Annotated[str | None, typer.Option(
        help="run the simulations as Ray tasks: 'local' (a private Ray on loopback, of "
        "--workers CPUs, else all), 'auto' (the cluster this machine is in) or a "
        "cluster's HOST:PORT (needs hops-scheduler[ray])")] = None,
    mba: Annotated[bool, typer.Option(
        help="'coda': the servers have MBA (the eliminator caps bandwidth, not cores)")] = False,
    generator: Annotated[str, typer.Option(
        help="requirement sets of the paper's workloads (table3, table4, priorities, "
        "arrival-rates): 'project' (sizes tied to job length, an assumption) or 'literal' "
        "(§4.2: 1-8 counts uniform over 1-16 GPUs)")] = "project",
    variant: Annotated[list[str] | None, typer.Option(
        help="a named variant to run beside its policy, repeatable: hops-paper (the "
        "paper's rules), sia-estimator (Sia given Hops' estimator), ...")] = None,
    jobs: Annotated[int, typer.Option(help="'hare': jobs per 160 GPUs")] = 200,
    load: Annotated[float | None, typer.Option(
        help="offered load of the arrivals, in units of the cluster's GPUs: 'traces' "
        "compresses each trace to it (default 1.35), 'hare' draws them at it "
        "(default 1.0)")] = None,
    clusters: Annotated[str | None, typer.Option(
        help="'hare': clusters, comma-separated (default: testbed, mixed-160, v100-160; "
        "also v100-k80-160)")] = None,
    horizon: Annotated[int | None, typer.Option(
        help="'hare': the task policies plan at most H rounds of each job and replan at "
        "every round's barrier, as the live leader does (default: the paper's offline "
        "plan of every round)")] = None,
) -> None:
    """Run a whole comparison; writes OUT/results.json, results.md and PNG plots."""
    try:  # the experiments are an extra (matplotlib): only this command needs them
        from experiments.catalog import Options
        from experiments.common.pool import Pool, PoolError, check
    except ImportError as exc:
        typer.echo(f"error: the experiments are not installed ({exc}); install "
                   "hops-scheduler[experiments] from a checkout", err=True)
        raise typer.Exit(2) from None
    entry = _experiment_entry(name, generator)
    try:
        pool = Pool(workers=workers, ray=ray)
        check(pool)  # a missing Ray fails before any work
        options = Options(
            seed=seed, trace=trace, first_n=first_n, compress=compress,
            rates=rates, policies=tuple(policy or ()),
            progress=progress, traces=traces, inner=inner, pool=pool, mba=mba,
            generator=generator, variants=tuple(variant or ()), jobs=jobs, load=load,
            clusters=clusters, horizon=horizon)
        entry.run(name, out, options)
    except PoolError as exc:
        typer.echo(f"error ({exc.code}): {exc.error}", err=True)
        raise typer.Exit(2) from None
    except (SpecError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo((out / "results.md").read_text())


def _experiment_entry(name: str, generator: str) -> Entry:
    """The catalog's entry for ``name``, or exit 2 saying why (an unknown
    name lists every name with its help)."""
    from experiments.catalog import EXPERIMENTS
    from experiments.tables.define import GENERATOR_CHOICES

    if generator not in GENERATOR_CHOICES:
        typer.echo(f"error: --generator must be one of {', '.join(GENERATOR_CHOICES)}, "
                   f"got {generator!r}", err=True)
        raise typer.Exit(2)
    entry = EXPERIMENTS.get(name)
    if entry is None:
        known = "".join(f"\n  {n}: {e.help}" for n, e in EXPERIMENTS.items())
        typer.echo(f"error: unknown experiment {name!r}; known:{known}", err=True)
        raise typer.Exit(2)
    if generator != "project" and not entry.generator:
        typer.echo(f"error: --generator does not apply to {name!r}", err=True)
        raise typer.Exit(2)
    return entry
