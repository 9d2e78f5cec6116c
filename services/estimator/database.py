"""The multi-layer throughput database of Hops §3.3 (Figure 3).

One :class:`JobTypeRecord` per (job, GPU type) with three layers:

1. the server-entity layer: per server, an aggregated table (keyed by the
   job's GPU count on that server) and a distributed table (keyed by the
   number of nodes of the placement);
2. the type layer: the same two tables over every server of the type;
3. the theoretical layer: the profiled time modules (§3.2) and the data-time
   and wait samples that running mode keeps adding (§3.5).

Table cells keep running statistics of per-GPU throughput. The value the
estimator reads is ``recent``: an exponentially weighted mean whose weight is
max(1/count, ``recent_weight``). For the first 1/recent_weight samples it is
the exact running mean, so a few samples are used at full statistical
efficiency; afterwards it forgets old samples geometrically, so a job whose
speed drifts (input pipeline warming up, a noisy neighbour leaving) is
tracked within ~1/recent_weight samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from services.estimator.datatime import DataTimeModel, DataTimeSamples, DataTimeSettings
from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ProfileReport, ThroughputSample, TimeModules

DEFAULT_RECENT_WEIGHT = 0.05
DEFAULT_SAMPLE_WINDOW = 4096


class StatState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    recent: float = 0.0


class TablesState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    agg: dict[int, StatState] = {}
    dist: dict[int, StatState] = {}


class RecordState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    job_id: JobId
    gpu_type: GpuType
    entity: dict[ServerId, TablesState] = {}
    type_layer: TablesState = TablesState()
    modules: TimeModules | None = None
    batch_size: int = 0
    profiled_on: ServerId | None = None
    data_times: tuple[float, ...] = ()
    wait_times: tuple[float, ...] = ()


class DatabaseState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything needed to rebuild a :class:`ThroughputDatabase`."""

    records: tuple[RecordState, ...] = ()
    recent_weight: float = DEFAULT_RECENT_WEIGHT
    sample_window: int = DEFAULT_SAMPLE_WINDOW
    datatime: DataTimeSettings = DataTimeSettings()


@dataclass(slots=True)
class RunningStat:
    """Running count, mean, sum of squared deviations (Welford) and the
    recency-weighted mean described in the module docstring."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    recent: float = 0.0

    def add(self, value: float, recent_weight: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.recent += max(1.0 / self.count, recent_weight) * (value - self.recent)

    @property
    def variance(self) -> float:
        return self.m2 / (self.count - 1) if self.count > 1 else 0.0

    def to_state(self) -> StatState:
        return StatState(self.count, self.mean, self.m2, self.recent)

    @classmethod
    def from_state(cls, s: StatState) -> RunningStat:
        return cls(s.count, s.mean, s.m2, s.recent)


@dataclass(slots=True)
class ThroughputTables:
    """The aggregated and distributed tables of one layer (Figure 3)."""

    agg: dict[int, RunningStat] = field(default_factory=dict)
    dist: dict[int, RunningStat] = field(default_factory=dict)

    def add(self, sample: ThroughputSample, recent_weight: float) -> None:
        table, key = (
            (self.agg, sample.local_gpus) if sample.nodes == 1 else (self.dist, sample.nodes)
        )
        table.setdefault(key, RunningStat()).add(sample.per_gpu_throughput, recent_weight)

    def to_state(self) -> TablesState:
        return TablesState(
            agg={k: v.to_state() for k, v in sorted(self.agg.items())},
            dist={k: v.to_state() for k, v in sorted(self.dist.items())},
        )

    @classmethod
    def from_state(cls, s: TablesState) -> ThroughputTables:
        return cls(
            agg={k: RunningStat.from_state(v) for k, v in s.agg.items()},
            dist={k: RunningStat.from_state(v) for k, v in s.dist.items()},
        )


@dataclass(slots=True)
class TheoreticalLayer:
    """Profiled time modules plus the growing data/wait history (§3.2).

    ``memo`` holds formula values the estimator computed from this layer;
    ``memo_basis`` is the (modules, data-time model) pair they were computed
    from. Both are replaced, never mutated, when they change, so comparing
    them by identity tells whether the memo is still valid (see
    :func:`services.estimator.estimator.theoretical_per_gpu`).
    """

    samples: DataTimeSamples
    modules: TimeModules | None = None
    batch_size: int = 0
    profiled_on: ServerId | None = None
    memo: dict[tuple[int, int, int, float, float, float], float] = field(
        default_factory=dict, compare=False, repr=False
    )
    memo_basis: tuple[TimeModules, DataTimeModel] | None = field(
        default=None, compare=False, repr=False
    )


@dataclass(slots=True)
class JobTypeRecord:
    """The database object of one job on one GPU type (§3.3)."""

    job_id: JobId
    gpu_type: GpuType
    theory: TheoreticalLayer
    entity: dict[ServerId, ThroughputTables] = field(default_factory=dict)
    type_layer: ThroughputTables = field(default_factory=ThroughputTables)
    # Bumped by every report that reaches this record, so that a reader can
    # cache what it derived from the record (the estimator caches curves).
    version: int = 0
    memo: object = field(default=None, compare=False, repr=False)

    def to_state(self) -> RecordState:
        return RecordState(
            job_id=self.job_id,
            gpu_type=self.gpu_type,
            entity={s: t.to_state() for s, t in sorted(self.entity.items())},
            type_layer=self.type_layer.to_state(),
            modules=self.theory.modules,
            batch_size=self.theory.batch_size,
            profiled_on=self.theory.profiled_on,
            data_times=self.theory.samples.data_times,
            wait_times=self.theory.samples.wait_times,
        )


class ThroughputDatabase:
    """All jobs' database objects, fed by profiler and running-mode reports."""

    def __init__(
        self,
        recent_weight: float = DEFAULT_RECENT_WEIGHT,
        sample_window: int = DEFAULT_SAMPLE_WINDOW,
        datatime: DataTimeSettings | None = None,
    ) -> None:
        if not 0.0 < recent_weight <= 1.0:
            raise ValueError(f"recent_weight must lie in (0, 1], got {recent_weight}")
        self.recent_weight = recent_weight
        self.sample_window = sample_window
        self.datatime = datatime or DataTimeSettings()
        self._jobs: dict[JobId, dict[GpuType, JobTypeRecord]] = {}

    def record(self, job_id: JobId, gpu_type: GpuType) -> JobTypeRecord | None:
        return self._jobs.get(job_id, {}).get(gpu_type)

    def jobs(self) -> tuple[JobId, ...]:
        return tuple(self._jobs)

    def profiled_types(self, job_id: JobId) -> tuple[GpuType, ...]:
        """GPU types whose theoretical layer holds time modules for the job."""
        return tuple(
            t for t, r in self._jobs.get(job_id, {}).items() if r.theory.modules is not None
        )

    def _record_for(self, job_id: JobId, gpu_type: GpuType) -> JobTypeRecord:
        by_type = self._jobs.setdefault(job_id, {})
        rec = by_type.get(gpu_type)
        if rec is None:
            samples = DataTimeSamples(self.sample_window, self.datatime)
            rec = JobTypeRecord(job_id, gpu_type, TheoreticalLayer(samples))
            by_type[gpu_type] = rec
        return rec

    def record_profile(self, report: ProfileReport) -> None:
        """Profiling mode: (re)set the time modules of the type and add the
        profiled data/wait samples to its history."""
        rec = self._record_for(report.job_id, report.gpu_type)
        rec.version += 1
        theory = rec.theory
        theory.modules = report.modules
        theory.batch_size = report.batch_size
        theory.profiled_on = report.server_id
        theory.samples.add(report.modules.t_d, report.modules.paired_waits())

    def record_sample(self, sample: ThroughputSample) -> None:
        """Running mode: update the entity and type tables (a zero throughput
        carries none) and extend the data/wait history."""
        rec = self._record_for(sample.job_id, sample.gpu_type)
        rec.version += 1
        if sample.per_gpu_throughput > 0:
            rec.entity.setdefault(sample.server_id, ThroughputTables()).add(
                sample, self.recent_weight
            )
            rec.type_layer.add(sample, self.recent_weight)
        rec.theory.samples.add(sample.data_times, sample.paired_waits())

    def forget(self, job_id: JobId) -> None:
        self._jobs.pop(job_id, None)

    def to_state(self) -> DatabaseState:
        records = tuple(
            rec.to_state()
            for job in sorted(self._jobs)
            for _, rec in sorted(self._jobs[job].items())
        )
        return DatabaseState(records, self.recent_weight, self.sample_window, self.datatime)

    @classmethod
    def from_state(cls, state: DatabaseState) -> ThroughputDatabase:
        db = cls(state.recent_weight, state.sample_window, state.datatime)
        for rs in state.records:
            rec = db._record_for(rs.job_id, rs.gpu_type)
            rec.entity = {s: ThroughputTables.from_state(t) for s, t in rs.entity.items()}
            rec.type_layer = ThroughputTables.from_state(rs.type_layer)
            rec.theory.modules = rs.modules
            rec.theory.batch_size = rs.batch_size
            rec.theory.profiled_on = rs.profiled_on
            rec.theory.samples.add(rs.data_times, rs.wait_times)
        return db
