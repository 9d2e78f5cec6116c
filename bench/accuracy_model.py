"""The estimator half of the accuracy study: what the examples are, what
Hops predicts for them, what was measured, and how running-mode samples
move the estimate (Hops §3.5, §4.1 and Figure 7b). Pure apart from loading
the example scripts to count their parameters.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import msgspec

from bench.accuracy_live import ROOT, Received
from estimation.database import ThroughputDatabase
from estimation.estimator import (
    cell_comm_time,
    other_collectives_time,
    predict,
    theoretical_per_gpu,
)
from estimation.formulas import iter_time
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import GpuType, JobId
from shared.job import JobSpec
from shared.jobreport import Sampled, decode_line
from shared.measurements import ProfileReport

GPU_TYPE = GpuType("cpu")
SCRIPTS = {"cnn": "examples/train_cnn.py", "lm": "examples/train_lm.py"}
CONFIGS: tuple[Configuration, ...] = (
    Configuration.of({"node-a": 1}),
    Configuration.of({"node-a": 2}),
    Configuration.of({"node-a": 1, "node-b": 1}),
)


def _load(name: str) -> ModuleType:
    path = ROOT / SCRIPTS[name]
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_spec(name: str) -> JobSpec:
    """The example's job: its script's default batch size and its model's
    parameter count (Eq. 2's ``params``), an endless run."""
    module = _load(name)
    args = module.parse_args([])
    if name == "cnn":
        model = module.SmallCNN()
    else:
        model = module.TinyLM(args.vocab, args.d_model, args.layers, args.seq_len)
    params = sum(p.numel() for p in model.parameters())
    return JobSpec(id=JobId(f"acc-{name}"), model=name, batch_size=int(args.batch_size),
                   params=int(params), total_samples=10**9, requirements=(1, 2),
                   command=(sys.executable, SCRIPTS[name]), workdir=str(ROOT))


def profiled_db(profile: ProfileReport) -> ThroughputDatabase:
    """A database holding only ``profile``."""
    db = ThroughputDatabase()
    db.record_profile(profile)
    return db


def formula_throughput(db: ThroughputDatabase, spec: JobSpec, cluster: Cluster,
                       config: Configuration) -> float:
    """The theoretical layer alone (Eqs. 1-5 with the data/wait history so
    far), as the configuration throughput of §3.5."""
    rec = db.record(spec.id, GPU_TYPE)
    if rec is None:
        raise LookupError(f"{spec.id} has no profile")
    nodes = config.num_nodes
    gpus = config.total_gpus if nodes == 1 else nodes  # the estimator's cells
    per_gpu = theoretical_per_gpu(rec.theory, spec, cluster.type_by_name[GPU_TYPE], gpus, nodes)
    return per_gpu * config.total_gpus


@dataclass(frozen=True)
class Breakdown:
    """Eq. (1)'s terms for one configuration, in milliseconds."""

    t_d: float
    t_f: float
    t_b: float
    t_u: float
    t_w: float
    t_c: float
    pattern: int
    iteration: float
    t_s: float = 0.0  # the other collectives' latency (buffer broadcasts, agreement)


def breakdown(db: ThroughputDatabase, spec: JobSpec, cluster: Cluster,
              config: Configuration) -> Breakdown:
    """The predicted iteration with the database's current history (means
    of T_d and T_w; the estimator uses the fitted Eq. 3 model), T_c as the
    estimator takes it (measured for this shape, else Eq. 2 with the type's
    latency per gradient bucket), the other collectives' latency, and the
    type's overlap residual in Eq. (1)."""
    rec = db.record(spec.id, GPU_TYPE)
    if rec is None or rec.theory.modules is None:
        raise LookupError(f"{spec.id} has no profile")
    m, gpu = rec.theory.modules, cluster.type_by_name[GPU_TYPE]
    data = rec.theory.samples.model()
    gpus = config.total_gpus if config.num_nodes == 1 else config.num_nodes
    wait_cache, wait_load = data.waits(gpus)
    t_w = data.p_cache * wait_cache + (1 - data.p_cache) * wait_load
    t_c = cell_comm_time(gpu, spec.params, gpus, config.num_nodes,
                         rec.theory.measured_comm(gpus, config.num_nodes), m.buckets)
    t_s = other_collectives_time(m, data, gpu, gpus, config.num_nodes)
    it = iter_time(data.mean, m.t_f, m.t_b, m.t_u, t_w + t_s, t_c, m.pattern,
                   residual=gpu.overlap_residual)
    ms = 1000.0
    return Breakdown(data.mean * ms, m.t_f * ms, m.t_b * ms, m.t_u * ms, t_w * ms, t_c * ms,
                     m.pattern, it * ms, t_s * ms)


@dataclass(frozen=True)
class Measured:
    """One configuration's run: the configuration throughput (Σ over servers
    of the mean per-GPU throughput after warm-up × the server's GPUs), its
    spread, and what the samples say of T_d, T_w and T_c (ms)."""

    throughput: float
    samples: int
    per_server: dict[str, float]
    cv: float
    t_d: float
    t_w: float
    t_c: float | None
    iteration: float


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def measure(run: Sequence[Received], config: Configuration, batch: int, warmup: int,
            comm: Sequence[float]) -> Measured:
    """:class:`Measured` from the run's samples, the first ``warmup`` of
    each server dropped; ``batch`` is the per-GPU batch, ``comm`` the
    all-reduce spans the job reported."""
    per_server: dict[str, float] = {}
    kept = []
    for server, gpus in config.parts:
        mine = [r.sample for r in run if r.sample.server_id == server][warmup:]
        if not mine:
            raise ValueError(f"no sample from {server} after {warmup} warm-up samples")
        kept.extend(mine)
        per_server[server] = _mean([s.per_gpu_throughput for s in mine]) * gpus
    rates = [s.per_gpu_throughput for s in kept]
    cv = statistics.pstdev(rates) / _mean(rates) if len(rates) > 1 else 0.0
    slowest = min(v / g for (_, g), v in zip(config.parts, per_server.values(), strict=True))
    return Measured(
        throughput=sum(per_server.values()), samples=len(kept), per_server=per_server, cv=cv,
        t_d=1000 * _mean([t for s in kept for t in s.data_times]),
        t_w=1000 * _mean([t for s in kept for t in s.wait_times]),
        t_c=1000 * _mean(comm) if comm else None, iteration=1000 * batch / slowest)


def reported_comm(report_file: Path, began: float, ended: float) -> list[float]:
    """All-reduce spans (s) of the ``sampled`` lines written in [began, ended]."""
    if not report_file.exists():
        return []
    spans: list[float] = []
    for raw in report_file.read_bytes().splitlines():
        line = decode_line(raw)
        if isinstance(line, Sampled) and began <= line.at <= ended:
            spans.extend(line.comm_times)
    return spans


def accuracy(predicted: float, measured: float) -> float:
    """1 - |predicted - measured| / measured."""
    return 1.0 - abs(predicted - measured) / measured


@dataclass(frozen=True)
class Step:
    """Figure 7b: the estimates after ``samples`` running-mode samples."""

    samples: int
    estimate: float
    formula: float


def figure7b(profile: ProfileReport, run: Sequence[Received], spec: JobSpec,
             cluster: Cluster, config: Configuration) -> list[Step]:
    """Feed the run's samples one by one (in arrival order, warm-up ones
    included, as the live estimator gets them) into a database that holds
    only the profile; the top-down estimate and the theoretical layer's
    after each."""
    db = profiled_db(profile)
    steps = [Step(0, predict(db, spec, cluster, config),
                  formula_throughput(db, spec, cluster, config))]
    for k, received in enumerate(run, start=1):
        db.record_sample(received.sample)
        steps.append(Step(k, predict(db, spec, cluster, config),
                          formula_throughput(db, spec, cluster, config)))
    return steps


def as_json(value: object) -> object:
    """Dataclasses and msgspec Structs as plain JSON-able values."""
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    return value
