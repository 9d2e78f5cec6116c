"""Workloads of the simulator: the paper's generators, the ElasticFlow traces
and the project's own workload files.

* :func:`paper_physical`: 25 jobs of Table 2 models over a 2.5 h submission
  window (Hops §4.2);
* :func:`paper_sim`: Poisson arrivals, 500 jobs at 100 jobs/h (§4.3);
* :func:`load_elasticflow`: a trace of microsoft/elasticflow-traces (MIT
  licence, simulator/data/elasticflow/LICENSE);
* a workload file: YAML/JSON, a list (or ``{jobs: [...]}``) of
  ``{spec: <JobSpec fields>, model: <catalog key>}``.

Requirement sets: §4.2 says only "between 1 and 16 GPUs, up to 8 choices".
The project generators tie the sizes to the job's length
(:func:`requirement_set`, an assumption); the ``*-literal`` generators draw
them as the paper states (:mod:`simulator.generators`) on the same jobs. Job
lengths come from Table 2's categories as GPU-hours on a reference GPU type;
docs/simulator-data.md documents every rule.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

import msgspec
import numpy as np

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec, ScalingRule
from shared.specs import SpecError, convert, read_document
from simulator.generators import literal_sets
from world.catalog import Category, ModelTruth
from world.truth import GroundTruth


class SimJob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A job of a simulated workload: what the user submits and which catalog
    model (``model``, a key of the truth's catalog) it really is."""

    spec: JobSpec
    model: str


class _WorkloadFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    jobs: tuple[SimJob, ...]


# GPU-hours per Table 2 category (§4.2: S 0-1 h, M 1-10 h, L 10-50 h, XL > 50 h),
# drawn log-uniformly; S starts at 0.1 h and XL stops at 100 h.
GPU_HOURS: dict[Category, tuple[float, float]] = {
    "S": (0.1, 1.0), "M": (1.0, 10.0), "L": (10.0, 50.0), "XL": (50.0, 100.0),
}
# The centre of a job's requirement set by category: longer jobs ask for more.
CENTRES: dict[Category, tuple[int, ...]] = {
    "S": (1, 2), "M": (1, 2, 4), "L": (2, 4, 8), "XL": (4, 8, 16),
}
MAX_GPUS = 16
MAX_CHOICES = 8
PHYSICAL_JOBS = 25
PHYSICAL_WINDOW_S = 2.5 * 3600.0

ELASTICFLOW_HEADER = ("job_id", "submission_time", "num_iteration", "model_name",
                      "deadline", "batch_size", "num_gpu", "duration")
# ElasticFlow model name -> closest Table 2 model, else closest Gavel job type
# (the first one the reference type supports is used).
ELASTICFLOW_MODELS: dict[str, tuple[str, str]] = {
    "resnet50": ("resnet50-imagenet", "gavel:ResNet-50 (batch size 64)"),
    "vgg16": ("vgg13-imagenet", "gavel:ResNet-50 (batch size 32)"),
    "inception3": ("resnet50-imagenet", "gavel:ResNet-50 (batch size 64)"),
    "bert": ("macbert-c3", "gavel:Transformer (batch size 64)"),
    "gpt2": ("gpt2-medium-wikitext", "gavel:Transformer (batch size 32)"),
    "deepspeech2": ("wav2vec2-common-language", "gavel:LM (batch size 20)"),
}
GENERATORS = ("paper-physical", "paper-sim", "paper-physical-literal", "paper-sim-literal")


def requirement_set(category: Category, rng: np.random.Generator) -> tuple[int, ...]:
    """The project's rule (an assumption; §4.2 says only 1-16 GPUs, up to 8
    choices): a centre c from the category's choices, then 1..8 distinct GPU
    counts from [max(1, c/2), min(16, 2c)] always including c."""
    centre = int(rng.choice(CENTRES[category]))
    pool = [g for g in range(max(1, centre // 2), min(MAX_GPUS, 2 * centre) + 1) if g != centre]
    k = int(rng.integers(1, min(MAX_CHOICES, len(pool) + 1) + 1))
    others = [int(g) for g in rng.choice(pool, size=k - 1, replace=False)] if k > 1 else []
    return tuple(sorted({centre, *others}))


def learning_rate(m: ModelTruth) -> tuple[float, ScalingRule]:
    """Base rate on one GPU and its scaling rule (§2.2): SGD at 0.1 per 256
    samples, linearly scaled (Goyal et al.); AdamW at 5e-5, square-root."""
    if m.optimizer == "sgd":
        return 0.1 * m.batch_size / 256.0, "linear"
    return 5e-5, "sqrt"


def reference_type(cluster: Cluster, truth: GroundTruth, models: Sequence[str]) -> GpuType:
    """The first GPU type of the cluster spec (the oldest in the built-in
    specs) that has GPUs and runs every model: job lengths are counted in its
    GPU-hours."""
    for t in cluster.gpu_types:
        if cluster.type_gpus(t.name) > 0 and all(truth.supports(m, t.name) for m in models):
            return t.name
    raise SpecError(f"cluster {cluster.name}: no GPU type runs all of the workload's models")


def _spec(job_id: str, m: ModelTruth, samples: float, reqs: tuple[int, ...],
          submit: float) -> JobSpec:
    lr, rule = learning_rate(m)
    return JobSpec(
        id=JobId(job_id), model=m.name, batch_size=m.batch_size, params=m.params,
        total_samples=max(1, round(samples)), requirements=reqs, base_lr=lr,
        lr_rule=rule, submit_time=submit,
    )


def _paper_jobs(times: Sequence[float], rng: np.random.Generator,
                catalog: Mapping[str, ModelTruth], truth: GroundTruth, cluster: Cluster,
                ref: GpuType | None) -> list[SimJob]:
    """Jobs of uniformly drawn Table 2 models; total_samples = GPU-hours x
    single-GPU throughput on the reference type."""
    names = sorted(k for k, m in catalog.items() if m.source == "paper" and m.category)
    gpu = ref or reference_type(cluster, truth, names)
    names = [k for k in names if truth.supports(k, gpu)]
    if not names:
        raise SpecError(f"no Table 2 model runs on {gpu}")
    jobs: list[SimJob] = []
    for i, submit in enumerate(times):
        m = catalog[names[int(rng.integers(len(names)))]]
        assert m.category is not None
        lo, hi = GPU_HOURS[m.category]
        hours = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        samples = hours * 3600.0 * truth.single_gpu_throughput(m.name, gpu)
        spec = _spec(f"job-{i:04d}", m, samples, requirement_set(m.category, rng), float(submit))
        jobs.append(SimJob(spec, m.name))
    return jobs


def paper_physical(seed: int, catalog: Mapping[str, ModelTruth], truth: GroundTruth,
                   cluster: Cluster, reference: GpuType | None = None) -> list[SimJob]:
    """The physical experiment's workflow (§4.2): 25 jobs submitted uniformly
    at random over 2.5 h."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, PHYSICAL_WINDOW_S, PHYSICAL_JOBS))
    return _paper_jobs(times.tolist(), rng, catalog, truth, cluster, reference)


def paper_sim(seed: int, catalog: Mapping[str, ModelTruth], truth: GroundTruth,
              cluster: Cluster, n: int = 500, rate_per_h: float = 100.0,
              reference: GpuType | None = None) -> list[SimJob]:
    """The simulation experiment's workflow (§4.3): ``n`` jobs arriving as a
    Poisson process of ``rate_per_h`` jobs per hour, the first at 0."""
    if n <= 0 or rate_per_h <= 0:
        raise SpecError(f"paper-sim needs n > 0 and rate_per_h > 0, got {n}, {rate_per_h}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / rate_per_h, n - 1)
    times = np.concatenate(([0.0], np.cumsum(gaps)))
    return _paper_jobs(times.tolist(), rng, catalog, truth, cluster, reference)


def with_literal_requirements(jobs: Sequence[SimJob], seed: int) -> list[SimJob]:
    """``jobs`` with the requirement sets read literally from §4.2
    (:func:`simulator.generators.requirement_set_literal`, their own stream)."""
    sets = literal_sets(len(jobs), seed)
    return [SimJob(msgspec.structs.replace(j.spec, requirements=r), j.model)
            for j, r in zip(jobs, sets, strict=True)]


def paper_physical_literal(seed: int, catalog: Mapping[str, ModelTruth], truth: GroundTruth,
                           cluster: Cluster, reference: GpuType | None = None) -> list[SimJob]:
    """:func:`paper_physical`'s jobs with §4.2's literal requirement sets."""
    return with_literal_requirements(
        paper_physical(seed, catalog, truth, cluster, reference), seed)


def paper_sim_literal(seed: int, catalog: Mapping[str, ModelTruth], truth: GroundTruth,
                      cluster: Cluster, n: int = 500, rate_per_h: float = 100.0,
                      reference: GpuType | None = None) -> list[SimJob]:
    """:func:`paper_sim`'s jobs with §4.2's literal requirement sets."""
    return with_literal_requirements(
        paper_sim(seed, catalog, truth, cluster, n, rate_per_h, reference), seed)


# --- ElasticFlow traces ----------------------------------------------------------------

def packed(cluster: Cluster, gpu: GpuType, gpus: int) -> Configuration:
    """``gpus`` GPUs of type ``gpu`` filling its servers in cluster order."""
    parts: dict[ServerId, int] = {}
    left = gpus
    for server in cluster.servers_of_type(gpu):
        if left <= 0:
            break
        parts[server.id] = min(server.gpus, left)
        left -= parts[server.id]
    return Configuration.of(parts)


def _trace_model(name: str, truth: GroundTruth, gpu: GpuType, where: str) -> str:
    choices = ELASTICFLOW_MODELS.get(name)
    if choices is None:
        raise SpecError(f"{where}: unknown model_name {name!r} "
                        f"(known: {', '.join(sorted(ELASTICFLOW_MODELS))})")
    for key in choices:
        if truth.supports(key, gpu):
            return key
    raise SpecError(f"{where}: no catalog model for {name!r} runs on {gpu}")


def _read_trace(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            if tuple(reader.fieldnames or ()) != ELASTICFLOW_HEADER:
                raise SpecError(f"{path.name}: not an ElasticFlow trace: header is "
                                f"{reader.fieldnames}, expected {','.join(ELASTICFLOW_HEADER)}")
            return list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SpecError(f"{path.name}: cannot read trace: {exc}") from None


def _trace_int(row: Mapping[str, str], field: str, where: str, minimum: int) -> int:
    try:
        value = int(row[field])
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {field} must be an integer, got {row[field]!r}") from None
    if value < minimum:
        raise SpecError(f"{where}: {field} must be >= {minimum}, got {value}")
    return value


def _requirements(num_gpu: int, top: int, elastic: bool) -> tuple[int, ...]:
    """Rigid {num_gpu}, or elastic {num_gpu/2, num_gpu, 2 num_gpu}, within [1, top]."""
    wanted = (num_gpu // 2, num_gpu, 2 * num_gpu) if elastic else (num_gpu,)
    return tuple(sorted({min(top, max(1, g)) for g in wanted}))


def load_elasticflow(path: str | Path, truth: GroundTruth, cluster: Cluster,
                     reference_type: GpuType, first_n: int | None = None,
                     compress: float = 1.0, elastic: bool = False) -> list[SimJob]:
    """Jobs of an ElasticFlow trace, in submission order.

    ``duration`` is read as the run time with ``num_gpu`` GPUs of
    ``reference_type`` packed onto its servers, so total_samples = duration x
    num_gpu x that placement's per-GPU throughput (at most the type's GPUs).
    Submission times are shifted to start at 0 and divided by ``compress``.
    """
    p = Path(path)
    _check_options(first_n, compress)
    if cluster.type_gpus(reference_type) <= 0:
        raise SpecError(f"reference type {reference_type!r} has no GPU in cluster {cluster.name}")
    rows = sorted(enumerate(_read_trace(p)),
                  key=lambda r: _trace_int(r[1], "submission_time", f"{p.name}:{r[0] + 2}", 0))
    rows = rows[:first_n] if first_n is not None else rows
    start = int(rows[0][1]["submission_time"]) if rows else 0
    per_gpu: dict[tuple[str, int], float] = {}
    jobs: list[SimJob] = []
    for line, row in rows:
        where = f"{p.name}:{line + 2}"
        model = _trace_model(row["model_name"], truth, reference_type, where)
        num_gpu = _trace_int(row, "num_gpu", where, 1)
        duration = _trace_int(row, "duration", where, 1)
        size = min(num_gpu, cluster.type_gpus(reference_type))
        if (model, size) not in per_gpu:
            config = packed(cluster, reference_type, size)
            per_gpu[(model, size)] = truth.throughput(model, config) / size
        m = truth.catalog[model]
        reqs = _requirements(num_gpu, cluster.total_gpus, elastic)
        submit = (int(row["submission_time"]) - start) / compress
        samples = duration * num_gpu * per_gpu[(model, size)]
        jobs.append(SimJob(_spec(row["job_id"] or f"job-{line}", m, samples, reqs, submit), model))
    return jobs


# --- workload files and dispatch ----------------------------------------------------------

def _check_options(first_n: int | None, compress: float) -> None:
    if first_n is not None and first_n < 0:
        raise SpecError(f"first_n must be >= 0, got {first_n}")
    if not (compress > 0 and math.isfinite(compress)):
        raise SpecError(f"compress must be a positive number, got {compress}")


def load_workload_file(path: str | Path, truth: GroundTruth) -> list[SimJob]:
    """A workload file: a list (or ``{jobs: [...]}``) of ``{spec, model}``."""
    p = Path(path)
    doc, lenient = read_document(p)
    if isinstance(doc, list):
        doc = {"jobs": doc}
    jobs = list(convert(doc, _WorkloadFile, p.name, lenient).jobs)
    for i, job in enumerate(jobs):
        if job.model not in truth.catalog:
            raise SpecError(f"{p.name}: jobs[{i}]: unknown model {job.model!r}")
    ids = [j.spec.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise SpecError(f"{p.name}: duplicate job id")
    return jobs


def dump_workload(jobs: Sequence[SimJob]) -> bytes:
    """The workload file (JSON) that :func:`load_workload_file` reads back."""
    return msgspec.json.encode({"jobs": list(jobs)})


def trim(jobs: Sequence[SimJob], first_n: int | None = None,
         compress: float = 1.0) -> list[SimJob]:
    """The first ``first_n`` jobs by submission, submit times divided by ``compress``."""
    _check_options(first_n, compress)
    ordered = sorted(jobs, key=lambda j: (j.spec.submit_time, j.spec.id))
    kept = ordered[:first_n] if first_n is not None else ordered
    if compress == 1.0:
        return kept
    return [SimJob(msgspec.structs.replace(j.spec, submit_time=j.spec.submit_time / compress),
                   j.model) for j in kept]


def packaged_trace(name: str) -> Path | None:
    """The packaged ElasticFlow trace ``elasticflow-clusterNN``, if it is one."""
    if not name.startswith("elasticflow-"):
        return None
    path = resources.files("simulator") / "data" / "elasticflow" / f"{name[12:]}.csv"
    return Path(str(path)) if path.is_file() else None


def load_workload(path_or_name: str, truth: GroundTruth, cluster: Cluster, *, seed: int = 0,
                  first_n: int | None = None, compress: float = 1.0,
                  reference: GpuType | None = None, elastic: bool = False,
                  rate_per_h: float | None = None) -> list[SimJob]:
    """A workload by generator name (:data:`GENERATORS`), packaged
    trace name (``elasticflow-cluster01`` .. ``04``), ElasticFlow CSV or
    workload file. ``first_n`` and ``compress`` apply to every source;
    ``rate_per_h`` (default 100) to ``paper-sim*``, ``elastic`` to traces and
    ``reference`` (the GPU type job lengths are counted on) to generators and
    traces."""
    _check_options(first_n, compress)
    if path_or_name in ("paper-physical", "paper-physical-literal"):
        physical = paper_physical_literal if path_or_name.endswith("-literal") else paper_physical
        jobs = physical(seed, truth.catalog, truth, cluster, reference)
    elif path_or_name in ("paper-sim", "paper-sim-literal"):
        sim = paper_sim_literal if path_or_name.endswith("-literal") else paper_sim
        rate = 100.0 if rate_per_h is None else rate_per_h
        jobs = sim(seed, truth.catalog, truth, cluster, rate_per_h=rate, reference=reference)
    else:
        trace = packaged_trace(path_or_name)
        path = trace or Path(path_or_name)
        if not path.is_file():
            raise SpecError(f"{path_or_name}: neither a generator ({', '.join(GENERATORS)}), "
                            "a packaged trace nor a workload file")
        if path.suffix.lower() == ".csv":
            models = sorted({m for pair in ELASTICFLOW_MODELS.values() for m in pair[:1]})
            ref = reference or _trace_reference(cluster, truth, models)
            return load_elasticflow(path, truth, cluster, ref, first_n, compress, elastic)
        jobs = load_workload_file(path, truth)
    return trim(jobs, first_n, compress)


def trace_reference(cluster: Cluster, truth: GroundTruth) -> GpuType:
    """The GPU type a trace's durations are read on, in ``cluster``."""
    models = sorted({m for pair in ELASTICFLOW_MODELS.values() for m in pair[:1]})
    return _trace_reference(cluster, truth, models)


def _trace_reference(cluster: Cluster, truth: GroundTruth, paper_models: Sequence[str]) -> GpuType:
    """Default reference type of a trace: for Table 2 models if the cluster
    runs them, else for the Gavel job types."""
    try:
        return reference_type(cluster, truth, paper_models)
    except SpecError:
        gavel = sorted({pair[1] for pair in ELASTICFLOW_MODELS.values()})
        return reference_type(cluster, truth, gavel)
