"""Estimator accuracy on real training runs (Hops §4.1, Figures 6 and 7b).

On this host (CPU cores standing in for GPUs, gloo over loopback):

1. measures the gloo all-reduce latency and bandwidth of two pinned
   one-thread processes and writes a cluster spec with them
   (:mod:`bench.accuracy_bw`): GPU type ``cpu`` with the fitted latency and
   bandwidths and ``overlap_residual`` 1.0 (a core cannot hide the
   all-reduce behind BP), ``node-a`` with 2 devices on cores 0 and 1,
   ``node-b`` with 1 on core 1;
2. starts nats-server and two REAL executors (:mod:`bench.accuracy_live`);
3. for each example script: a profiling run on one device, its
   ``profile_reported`` into a :class:`ThroughputDatabase`, the §3.5
   prediction of {node-a:1}, {node-a:2} and {node-a:1, node-b:1}; then each
   configuration runs for ``--seconds`` and its ``sample_reported`` give the
   measured throughput (:mod:`bench.accuracy_model`); as a control, the job
   and a twin also run as two separate one-process jobs on the two cores at
   once (no communication), predicted at twice the one-process throughput;
4. Figure 7b: each multi-process run's samples fed one by one into a
   database holding only the profile, and the estimate after each.

Steps 3-4 are repeated ``--repeats`` times: this host's own speed drifts,
so one pass says little about the spread.

At most two training processes run at any time, each pinned to its own core.

    .venv/bin/python bench/accuracy.py [--out DIR] [--seconds N] [--models cnn,lm]
        [--repeats N] [--docs]

Prints the tables; writes ``DIR/accuracy.json`` (default ``out/accuracy``)
and, with ``--docs``, the tables of ``docs/accuracy.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import torch

from bench import accuracy_bw as bw
from bench.accuracy_docs import fig7b_table, setup_text, table_text, update_docs
from bench.accuracy_live import Bus, Executors, Profiled, RunWindow
from bench.accuracy_model import (
    CONFIGS,
    SCRIPTS,
    Breakdown,
    Measured,
    Step,
    accuracy,
    breakdown,
    figure7b,
    job_spec,
    measure,
    profiled_db,
    reported_comm,
)
from estimation.database import ThroughputDatabase
from estimation.estimator import predict
from services.runtime.natsd import EmbeddedNats
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import JobId
from shared.job import JobSpec

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, default=ROOT / "out" / "accuracy",
                   help="folder of accuracy.json (default out/accuracy)")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="run time of each configuration after its first sample (default 20)")
    p.add_argument("--models", default="cnn,lm", help="examples to study (cnn, lm)")
    p.add_argument("--sample-s", type=float, default=2.0,
                   help="running-mode sample period (default 2 s)")
    p.add_argument("--warmup-samples", type=int, default=2,
                   help="samples of each server dropped as warm-up (default 2)")
    p.add_argument("--profile-iters", type=int, default=50,
                   help="measured iterations of a profiling run (default 50, §3.2's most)")
    p.add_argument("--quiet", type=float, default=0.1,
                   help="share of all cores other work may take before a run is repeated "
                        "(default 0.1)")
    p.add_argument("--tries", type=int, default=3,
                   help="runs of a disturbed profile or configuration, at most (default 3)")
    p.add_argument("--repeats", type=int, default=1,
                   help="whole passes (profile, predictions, runs) over the models (default 1)")
    p.add_argument("--docs", action="store_true", help="update docs/accuracy.md's tables")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(SCRIPTS))
    if unknown:
        p.error(f"unknown models {unknown}; known: {sorted(SCRIPTS)}")
    return args


@dataclass(frozen=True)
class Row:
    """One configuration of one model: prediction against measurement."""

    model: str
    config: str
    predicted: float
    measured: Measured
    accuracy: float
    expected: Breakdown
    foreign: float
    steal: float
    attempts: int


@dataclass(frozen=True)
class ModelResult:
    """One example in one pass: its profile, its rows and its Figure 7b series."""

    model: str
    params: int
    batch_size: int
    profile: dict[str, object]
    rows: list[Row]
    fig7b: dict[str, list[Step]]


def profile_summary(profiled: Profiled) -> dict[str, object]:
    """The profile's modules in milliseconds, and how disturbed it was."""
    m = profiled.report.modules
    return {"t_f_ms": 1000 * m.t_f, "t_b_ms": 1000 * m.t_b, "t_u_ms": 1000 * m.t_u,
            "t_d_mean_ms": 1000 * sum(m.t_d) / max(1, len(m.t_d)), "pattern": m.pattern,
            "iterations": len(m.t_d), "foreign": profiled.share.foreign,
            "attempts": profiled.attempts}


TWO_JOBS = "{node-a:1} + {node-b:1} (two jobs)"


def _row(spec: JobSpec, label: str, predicted: float, got: Measured, expected: Breakdown,
         run: RunWindow) -> Row:
    row = Row(spec.model, label, predicted, got, accuracy(predicted, got.throughput), expected,
              run.share.foreign, run.share.steal, run.attempts)
    print(f"  {label}: predicted {predicted:.1f}, measured {got.throughput:.1f} samples/s "
          f"({got.samples} samples), accuracy {row.accuracy:.1%}; other work "
          f"{run.share.foreign:.1%} of the CPUs ({run.attempts} runs)", flush=True)
    return row


async def two_jobs(bus: Bus, spec: JobSpec, cluster: Cluster, db: ThroughputDatabase,
                   args: argparse.Namespace) -> Row:
    """The control: the job and a twin as two separate one-process jobs, on
    node-a's core 0 and node-b's core 1 at once (no communication between
    them). The estimator predicts each at its one-process throughput."""
    single = CONFIGS[0]
    twin = msgspec.structs.replace(spec, id=JobId(f"{spec.id}-twin"))
    run = await bus.run([(spec, single), (twin, Configuration.of({"node-b": 1}))],
                        args.seconds)
    got = measure(run.samples, CONFIGS[2], spec.batch_size, args.warmup_samples, [])
    return _row(spec, TWO_JOBS, 2 * predict(db, spec, cluster, single), got,
                breakdown(db, spec, cluster, single), run)


async def study_model(bus: Bus, spec: JobSpec, cluster: Cluster, args: argparse.Namespace,
                      run_dir: Path) -> ModelResult:
    """Profile, predict, run, measure and trace one example (steps 3-4)."""
    print(f"{spec.model}: {spec.params} parameters, batch {spec.batch_size}; profiling",
          flush=True)
    profiled = await bus.profile(spec)
    db = profiled_db(profiled.report)
    rows: list[Row] = []
    series: dict[str, list[Step]] = {}
    for config in CONFIGS:
        predicted = predict(db, spec, cluster, config)
        run = await bus.run([(spec, config)], args.seconds)
        report = run_dir / spec.id / "reports" / f"{config.servers[0]}.jsonl"
        got = measure(run.samples, config, spec.batch_size, args.warmup_samples,
                      reported_comm(report, run.began, run.ended))
        rows.append(_row(spec, str(config), predicted, got,
                         breakdown(db, spec, cluster, config), run))
        if config.total_gpus > 1:
            series[str(config)] = figure7b(profiled.report, run.samples, spec, cluster, config)
    rows.append(await two_jobs(bus, spec, cluster, db, args))
    return ModelResult(spec.model, spec.params, spec.batch_size, profile_summary(profiled),
                       rows, series)


Repeats = list[list[ModelResult]]  # per pass, per model


async def study(args: argparse.Namespace, specs: list[JobSpec], cluster: Cluster,
                nats_url: str, run_dir: Path) -> Repeats:
    """Every pass over every example, through one NATS connection."""
    bus = await Bus.open(nats_url, args.quiet, args.tries)
    passes: Repeats = []
    try:
        await bus.ready()
        for n in range(args.repeats):
            print(f"pass {n + 1} of {args.repeats}", flush=True)
            passes.append([await study_model(bus, spec, cluster, args, run_dir)
                           for spec in specs])
        return passes
    finally:
        await bus.close()


def run_all(args: argparse.Namespace, tmp: Path) -> tuple[bw.Bandwidth, Repeats]:
    """Steps 1-4 in a scratch folder."""
    print("measuring gloo all-reduce latency and bandwidth (2 pinned processes)", flush=True)
    band = bw.measure()
    cluster = bw.cluster_of(band)
    cluster_file = bw.write_cluster(cluster, tmp / "cluster.json")
    print(f"  latency {1000 * band.latency_s:.3f} ms, B_link {band.link:.3g} params/s, "
          f"B_net {band.net:.3g} params/s", flush=True)
    specs = [job_spec(name) for name in args.models]
    run_dir = tmp / "runs"
    run_dir.mkdir()
    with EmbeddedNats(tmp / "nats") as nats:
        executors = Executors(cluster_file, nats.url, run_dir, args.sample_s, args.profile_iters)
        executors.start()
        try:
            results = asyncio.run(study(args, specs, cluster, nats.url, run_dir))
        finally:
            executors.stop()
    return band, results


def host() -> dict[str, object]:
    """What the numbers were measured on."""
    return {"date": datetime.date.today().isoformat(), "cpu": platform.processor() or "?",
            "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
            "python": platform.python_version(), "backend": "gloo"}


def to_json(args: argparse.Namespace, band: bw.Bandwidth, results: Repeats) -> dict[str, object]:
    """The study's results as written to ``accuracy.json``."""
    return {
        "host": host(),
        "settings": {"seconds": args.seconds, "sample_s": args.sample_s,
                     "warmup_samples": args.warmup_samples, "profile_iters": args.profile_iters,
                     "quiet": args.quiet, "tries": args.tries, "repeats": args.repeats},
        "allreduce_s": {str(k): v for k, v in band.times.items()},
        "allreduce_spread_s": {str(k): v for k, v in band.spread.items()},
        "bandwidth": {"link": band.link, "net": band.net, "latency_s": band.latency_s,
                      "overlap_residual": bw.CPU_OVERLAP_RESIDUAL},
        "repeats": [[asdict(r) for r in models] for models in results],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the study, print and write its results."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hops-accuracy-") as tmp:
        band, results = run_all(args, Path(tmp))
    data = to_json(args, band, results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accuracy.json").write_text(json.dumps(data, indent=2) + "\n")
    print()
    print(setup_text(data))
    print(table_text(data))
    print(fig7b_table(data))
    if args.docs:
        update_docs(ROOT / "docs" / "accuracy.md", data)
    print(f"wrote {args.out / 'accuracy.json'}" + (" and docs/accuracy.md" if args.docs else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
