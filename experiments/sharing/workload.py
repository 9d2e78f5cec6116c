"""Multi-tenant workloads for the sharing experiment (issue 20; HiveD §5.2).

A multi-tenant workload is either one trace CSV with the ElasticFlow columns
and a ``tenant`` column, or several ElasticFlow traces, one tenant each,
named after the file's stem (``cluster01.csv`` is tenant ``cluster01``).
The default traces, microsoft/elasticflow-traces (Gu et al., ASPLOS'23; MIT
licence, simulator/data/elasticflow/LICENSE), were collected on one clock, so
only the period they share is used: the intersection of their submission-time ranges
(:func:`shared_period`). Each job carries its tenant in ``JobSpec.tenant``;
its id is ``<tenant>/<trace job id>``.

Besides the jobs, the loader keeps what the quota rule of docs/tenancy.md
("Rules") needs: each tenant's GPU-seconds (``num_gpu x duration``) and its
largest job, over the period. Like the other loaders it reads files and
nothing else.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from shared.cluster import Cluster
from shared.ids import GpuType, JobId, TenantId
from shared.specs import SpecError
from simulator.workloads import (
    ELASTICFLOW_HEADER,
    SimJob,
    _requirements,
    _spec,
    _trace_int,
    _trace_model,
    packed,
)
from world.truth import GroundTruth

TENANT_FIELD = "tenant"


class TenantDemand(msgspec.Struct, frozen=True):
    """A tenant's jobs in the period: how many, their GPU-seconds
    (``num_gpu x duration``) and the largest ``num_gpu``."""

    tenant: str
    jobs: int
    gpu_seconds: float
    max_gpus: int


class TraceRow(msgspec.Struct, frozen=True):
    """One job of a trace: its tenant, its place in the file, its fields."""

    tenant: str
    where: str
    fields: dict[str, str]
    submit: int


class TenantWorkload(msgspec.Struct, frozen=True):
    """The trace rows in the shared period (submission order), the period on
    the traces' clock, and each tenant's demand over the whole period."""

    rows: tuple[TraceRow, ...]
    start: int
    end: int
    demands: tuple[TenantDemand, ...]

    @property
    def period_s(self) -> float:
        return float(self.end - self.start)

    def tenants(self) -> tuple[str, ...]:
        return tuple(d.tenant for d in self.demands)


def read_tenant_rows(path: Path) -> list[TraceRow]:
    """The rows of one trace: ElasticFlow columns, plus ``tenant`` or not
    (then the tenant is the file's stem)."""
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            names = tuple(reader.fieldnames or ())
            missing = [f for f in ELASTICFLOW_HEADER if f not in names]
            if missing:
                raise SpecError(f"{path.name}: not an ElasticFlow trace: missing column(s) "
                                f"{', '.join(missing)}")
            raw = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SpecError(f"{path.name}: cannot read trace: {exc}") from None
    rows = []
    for i, r in enumerate(raw):
        where = f"{path.name}:{i + 2}"
        tenant = (r.get(TENANT_FIELD) or "").strip() if TENANT_FIELD in names else path.stem
        if not tenant:
            raise SpecError(f"{where}: empty tenant")
        rows.append(TraceRow(tenant, where, dict(r), _trace_int(r, "submission_time", where, 0)))
    return rows


def shared_period(groups: Mapping[str, Sequence[int]]) -> tuple[int, int]:
    """[max of the groups' first submissions, min of their last]: the period
    every trace covers. A SpecError when they share none."""
    if not groups or any(not times for times in groups.values()):
        raise SpecError("shared period: every tenant needs at least one job")
    start = max(min(t) for t in groups.values())
    end = min(max(t) for t in groups.values())
    if end < start:
        raise SpecError(f"the traces share no period: latest first submission {start} "
                        f"is after earliest last submission {end}")
    return start, end


def _demands(rows: Sequence[TraceRow]) -> tuple[TenantDemand, ...]:
    acc: dict[str, list[float]] = {}
    for r in rows:
        gpus = _trace_int(r.fields, "num_gpu", r.where, 1)
        seconds = _trace_int(r.fields, "duration", r.where, 1)
        a = acc.setdefault(r.tenant, [0, 0.0, 0])
        a[0] += 1
        a[1] += gpus * seconds
        a[2] = max(a[2], gpus)
    return tuple(TenantDemand(t, int(a[0]), float(a[1]), int(a[2])) for t, a in sorted(acc.items()))


def read_tenant_traces(paths: Sequence[str | Path]) -> TenantWorkload:
    """The rows of the traces over the period their tenants share, in
    submission order (ties by tenant, then trace job id), with each tenant's
    demand over that period."""
    rows = [r for p in paths for r in read_tenant_rows(Path(p))]
    by_tenant: dict[str, list[int]] = {}
    for r in rows:
        by_tenant.setdefault(r.tenant, []).append(r.submit)
    start, end = shared_period(by_tenant)
    kept = sorted((r for r in rows if start <= r.submit <= end),
                  key=lambda r: (r.submit, r.tenant, r.fields["job_id"]))
    return TenantWorkload(tuple(kept), start, end, _demands(kept))


def tenant_jobs(workload: TenantWorkload, truth: GroundTruth, cluster: Cluster,
                reference_type: GpuType, first_n: int | None = None) -> list[SimJob]:
    """The jobs of ``workload``, submission times relative to its start;
    ``first_n`` keeps the first jobs of the merged workload. Job lengths
    follow :func:`simulator.workloads.load_elasticflow` (``duration`` is the
    run time with ``num_gpu`` GPUs of ``reference_type`` packed)."""
    if first_n is not None and first_n < 0:
        raise SpecError(f"first_n must be >= 0, got {first_n}")
    chosen = workload.rows[:first_n] if first_n is not None else workload.rows
    jobs = _jobs(chosen, truth, cluster, reference_type, workload.start)
    ids = [j.spec.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise SpecError("duplicate job id within a tenant")
    return jobs


def _jobs(rows: Sequence[TraceRow], truth: GroundTruth, cluster: Cluster, gpu: GpuType,
          start: int) -> list[SimJob]:
    per_gpu: dict[tuple[str, int], float] = {}
    jobs: list[SimJob] = []
    for r in rows:
        model = _trace_model(r.fields["model_name"], truth, gpu, r.where)
        num_gpu = _trace_int(r.fields, "num_gpu", r.where, 1)
        duration = _trace_int(r.fields, "duration", r.where, 1)
        size = min(num_gpu, cluster.type_gpus(gpu))
        if (model, size) not in per_gpu:
            per_gpu[(model, size)] = truth.throughput(model, packed(cluster, gpu, size)) / size
        m = truth.catalog[model]
        reqs = _requirements(num_gpu, cluster.total_gpus, False)
        job_id = f"{r.tenant}/{r.fields['job_id'] or r.where}"
        spec = _spec(job_id, m, duration * num_gpu * per_gpu[(model, size)], reqs,
                     float(r.submit - start))
        spec = msgspec.structs.replace(spec, tenant=TenantId(r.tenant))
        jobs.append(SimJob(spec, model))
    return jobs


def tenant_of(jobs: Sequence[SimJob]) -> dict[JobId, str]:
    return {j.spec.id: str(j.spec.tenant) for j in jobs}
