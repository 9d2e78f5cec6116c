"""``hops experiment NAME``: the table from each name to its experiment's
folder, and the options of the command that each one reads.

An :class:`Entry` is a run function and its one-line help; the command
looks the name up in :data:`EXPERIMENTS` and calls the entry's ``run``,
which writes ``OUT/results.md`` among its outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from experiments.cellfrag.run import run_cell_fragmentation
from experiments.cellfrag.stress import StressSettings
from experiments.coda.run import POLICIES as CORE_POLICIES
from experiments.coda.run import run as run_coda
from experiments.common.pool import Pool
from experiments.common.simrun import rich_progress
from experiments.common.suite import run_experiment
from experiments.hare.run import HareExperiment
from experiments.hare.run import run as run_hare
from experiments.sharing.run import DEFAULT_TRACES, run_sharing
from experiments.tables.define import default_policies, define, with_variants


class Options(msgspec.Struct, frozen=True):
    """The command's options; each experiment reads those it documents."""

    seed: int
    trace: str | None
    first_n: int | None
    compress: float
    rates: str  # arrival rates per hour, comma-separated
    policies: tuple[str, ...]  # empty: the experiment's own
    progress: bool
    traces: str | None
    inner: str
    pool: Pool  # where the independent simulations run (--workers, --ray)
    mba: bool
    generator: str
    variants: tuple[str, ...]
    jobs: int
    load: float | None
    clusters: str | None
    horizon: int | None = None


class Entry(msgspec.Struct, frozen=True):
    """One experiment: ``run(name, out, options)`` and its help. ``generator``:
    whether it takes ``--generator`` (the paper's workloads do)."""

    run: Callable[[str, Path, Options], None]
    help: str
    generator: bool = False


def _tables(name: str, out: Path, o: Options) -> None:
    per_hour = tuple(float(r) for r in o.rates.split(","))
    compared = with_variants(o.policies or default_policies(name), o.variants)
    exp = define(name, seed=o.seed, trace=o.trace, first_n=o.first_n, compress=o.compress,
                 rates=per_hour, policies=compared, generator=o.generator, load=o.load)
    run_experiment(exp, out, rich_progress if o.progress else None, pool=o.pool)


def _sharing(name: str, out: Path, o: Options) -> None:
    chosen = tuple(t for t in o.traces.split(",") if t) if o.traces else DEFAULT_TRACES
    run_sharing(out, chosen, first_n=o.first_n, inner=o.inner, only=o.policies or None,
                progress=rich_progress if o.progress else None, pool=o.pool)


def _coda(name: str, out: Path, o: Options) -> None:
    run_coda(out, inner=o.inner, trace=o.trace or "elasticflow-cluster04",
             first_n=o.first_n, compress=o.compress, seed=o.seed,
             policies=o.policies or CORE_POLICIES, pool=o.pool, mba=o.mba)


def _hare(name: str, out: Path, o: Options) -> None:
    hare = HareExperiment(jobs=o.jobs, seed=o.seed, horizon=o.horizon,
                          policies=o.policies or HareExperiment().policies)
    if o.load is not None:
        hare = msgspec.structs.replace(hare, load=o.load)
    if o.clusters is not None:
        hare = msgspec.structs.replace(hare, clusters=tuple(o.clusters.split(",")))
    run_hare(out, hare, pool=o.pool, progress=_echo if o.progress else None)


def _echo(line: str) -> None:
    print(line, flush=True)


def _cell_fragmentation(name: str, out: Path, o: Options) -> None:
    run_cell_fragmentation(out, StressSettings(seed=o.seed), pool=o.pool)


EXPERIMENTS: Mapping[str, Entry] = {
    "table3": Entry(_tables, "the physical 64-GPU cluster (Table 3)", generator=True),
    "table4": Entry(_tables, "the simulated 512-GPU cluster (Table 4)", generator=True),
    "priorities": Entry(_tables, "Hops under each queue priority (Figure 13)",
                        generator=True),
    "arrival-rates": Entry(_tables, "average JCT against the arrival rate (§4.6)",
                           generator=True),
    "elasticflow": Entry(_tables, "one ElasticFlow trace (--trace)", generator=True),
    "traces": Entry(_tables, "the four ElasticFlow traces at a set load", generator=True),
    "sharing": Entry(_sharing, "HiveD against quotas and private clusters (docs/tenancy.md)"),
    "coda": Entry(_coda, "CPU cores as a scheduled resource (docs/coda.md)"),
    "cell-fragmentation": Entry(_cell_fragmentation, "HiveD's Figure 8 stress test"),
    "hare": Entry(_hare, "Hare against its baselines and Hops (docs/hare.md)"),
}
