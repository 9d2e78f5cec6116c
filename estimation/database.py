"""The multi-layer throughput database of Hops §3.3 (Figure 3).

One :class:`JobTypeRecord` per (job, GPU type) with three layers:

1. the server-entity layer: per server, an aggregated table (keyed by the
   job's GPU count on that server) and a distributed table (keyed by the
   number of nodes of the placement);
2. the type layer: the same two tables over every server of the type;
3. the theoretical layer: the profiled time modules (§3.2) and the data-time
   and wait samples that running mode keeps adding (§3.5), each with the
   number of ranks it ran with (waits are estimated per rank count), plus the
   all-reduce times running jobs measured, per placement shape (T_c of
   Eq. 1 measured instead of modelled by Eq. 2; not in the paper).

With ``reuse`` on, a job not profiled on a type is estimated from its
profile signature's shared profile there (:mod:`estimation.shared_profiles`,
a departure from the paper's one record per job).

Table cells keep running statistics of per-GPU throughput. The value the
estimator reads is ``recent``: an exponentially weighted mean whose weight is
max(1/count, ``recent_weight``). For the first 1/recent_weight samples it is
the exact running mean, so a few samples are used at full statistical
efficiency; afterwards it forgets old samples geometrically, so a job whose
speed drifts (input pipeline warming up, a noisy neighbour leaving) is
tracked within ~1/recent_weight samples.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import msgspec

from estimation.datatime import DataTimeModel, DataTimeSamples, DataTimeSettings
from estimation.shared_profiles import SharedProfiles, SharedState
from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ProfileReport, ThroughputSample, TimeModules
from shared.reuse import Signature

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


class CommState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Measured all-reduce time of one placement shape (see
    :attr:`TheoreticalLayer.comm`)."""

    nodes: int
    total_gpus: int
    stat: StatState = StatState()


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
    comm: tuple[CommState, ...] = ()
    # Ranks each data/wait sample ran with; empty (states written before it
    # was kept) reads as one each.
    wait_ranks: tuple[int, ...] = ()
    # Seeded from its signature's shared profile, not profiled itself.
    reused: bool = False


class DatabaseState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything needed to rebuild a :class:`ThroughputDatabase`."""

    records: tuple[RecordState, ...] = ()
    recent_weight: float = DEFAULT_RECENT_WEIGHT
    sample_window: int = DEFAULT_SAMPLE_WINDOW
    datatime: DataTimeSettings = DataTimeSettings()
    # Empty and off in states written before profiles were shared.
    shared: tuple[SharedState, ...] = ()
    reuse: bool = False


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


CommShape = tuple[int, int]
"""(nodes, total GPUs) of a placement: the key of measured T_c."""

# (gpus, nodes, batch, params, B_link, B_net, link latency, net latency,
# overlap residual): everything a memoised formula value depends on besides
# the memo basis.
MemoKey = tuple[int, int, int, float, float, float, float, float, float]


@dataclass(slots=True)
class TheoreticalLayer:
    """Profiled time modules plus the growing data/wait history (§3.2), and
    the all-reduce times that running jobs measured.

    ``comm`` keeps a running statistic of the mean measured all-reduce time
    of each sample, keyed by the placement's (nodes, total GPUs). Those are
    Eq. (2)'s own inputs (d_n and N); how the GPUs split over the nodes is
    not one of them, and on one node the local count is the total. Across
    nodes Eq. (2) ignores N, but a real ring's steps and traffic grow with
    it, so rings of different sizes are kept apart rather than pooled: a
    measured value is used only for the shape it was measured on. (The
    estimator models its distributed cell for n nodes with one GPU per node,
    so that cell reads the (n, n) entry.) ``comm_version`` counts changes of
    ``comm``.

    ``memo`` holds formula values the estimator computed from this layer;
    ``memo_basis`` is the (modules, data-time model, comm_version) they were
    computed from. The first two are replaced, never mutated, when they
    change, so comparing them by identity, and the version by value, tells
    whether the memo is still valid (see
    :func:`estimation.estimator.theoretical_per_gpu`).
    """

    samples: DataTimeSamples
    modules: TimeModules | None = None
    batch_size: int = 0
    profiled_on: ServerId | None = None
    comm: dict[CommShape, RunningStat] = field(default_factory=dict)
    comm_version: int = 0
    memo: dict[MemoKey, float] = field(default_factory=dict, compare=False, repr=False)
    memo_basis: tuple[TimeModules, DataTimeModel, int] | None = field(
        default=None, compare=False, repr=False
    )

    def add_comm(self, sample: ThroughputSample, recent_weight: float) -> None:
        """Add the sample's mean all-reduce time to its shape's statistic. A
        one-GPU placement has nothing to reduce (Eq. 2 gives 0), so any time
        it reports is not T_c and is left out."""
        if not sample.comm_times or sample.total_gpus <= 1:
            return
        shape = (sample.nodes, sample.total_gpus)
        mean = statistics.fmean(sample.comm_times)
        self.comm.setdefault(shape, RunningStat()).add(mean, recent_weight)
        self.comm_version += 1

    def measured_comm(self, gpus: int, nodes: int) -> float | None:
        """The measured T_c of ``gpus`` GPUs over ``nodes`` nodes (its
        recency-weighted mean, like the throughput tables), or None."""
        stat = self.comm.get((nodes, gpus))
        return stat.recent if stat is not None and stat.count > 0 else None

    def comm_to_state(self) -> tuple[CommState, ...]:
        return tuple(CommState(n, g, stat.to_state()) for (n, g), stat in sorted(self.comm.items()))

    def comm_from_state(self, states: tuple[CommState, ...]) -> None:
        self.comm = {(c.nodes, c.total_gpus): RunningStat.from_state(c.stat) for c in states}
        self.comm_version += 1


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
    # Its modules came from its signature's shared profile (not profiled).
    reused: bool = False

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
            comm=self.theory.comm_to_state(),
            wait_ranks=self.theory.samples.rank_counts,
            reused=self.reused,
        )

    def take_profile(self, report: ProfileReport) -> None:
        """(Re)set the time modules and add the profiled data/wait samples."""
        self.version += 1
        theory = self.theory
        theory.modules = report.modules
        theory.batch_size = report.batch_size
        theory.profiled_on = report.server_id
        # A profile runs on one GPU (§3.2).
        theory.samples.add(report.modules.t_d, report.modules.paired_waits(), ranks=1)


class ThroughputDatabase:
    """All jobs' database objects, fed by profiler and running-mode reports."""

    def __init__(
        self,
        recent_weight: float = DEFAULT_RECENT_WEIGHT,
        sample_window: int = DEFAULT_SAMPLE_WINDOW,
        datatime: DataTimeSettings | None = None,
        reuse: bool = False,
    ) -> None:
        if not 0.0 < recent_weight <= 1.0:
            raise ValueError(f"recent_weight must lie in (0, 1], got {recent_weight}")
        self.recent_weight = recent_weight
        self.sample_window = sample_window
        self.datatime = datatime or DataTimeSettings()
        self._jobs: dict[JobId, dict[GpuType, JobTypeRecord]] = {}
        self.reuse = reuse
        self.shared = SharedProfiles()

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
        rec.take_profile(report)
        rec.reused = False
        self.shared.record(report)

    def share_profile(self, report: ProfileReport) -> None:
        """Only the shared part of :meth:`record_profile`: the profile of a
        job that has ended serves its signature, the job gets no record."""
        self.shared.record(report)

    def shared_types(self, signature: Signature | None) -> frozenset[GpuType]:
        """The types a job of ``signature`` need not be profiled on: those
        with a current shared profile (none with ``reuse`` off)."""
        return self.shared.types(signature) if self.reuse else frozenset()

    def estimate_record(
        self, job_id: JobId, signature: Signature | None, gpu_type: GpuType
    ) -> JobTypeRecord | None:
        """The record the estimator reads for the job on ``gpu_type``: its
        own once it holds time modules; otherwise, with ``reuse`` on, its own
        record seeded from the signature's shared profile (the first read
        seeds it; its samples then correct it, §3.5)."""
        rec = self.record(job_id, gpu_type)
        if (rec is not None and rec.theory.modules is not None) or not self.reuse:
            return rec
        report = self.shared.get(signature, gpu_type)
        if report is None:
            return rec
        rec = self._record_for(job_id, gpu_type)
        rec.take_profile(report)
        rec.reused = True
        return rec

    def checks_reuse(self, job_id: JobId, gpu_type: GpuType) -> bool:
        """Whether the job's record on ``gpu_type`` was seeded from its
        signature's shared profile and holds no running sample of its own
        yet: its first samples are then compared with the estimate
        (:func:`shared.reuse.first_samples_disagree`)."""
        own = self.record(job_id, gpu_type)
        return own is not None and own.reused and not own.type_layer.agg and not own.type_layer.dist

    def mark_stale(
        self, signature: Signature, gpu_types: frozenset[GpuType] | None = None
    ) -> tuple[GpuType, ...]:
        """Have the signature profiled again on ``gpu_types`` (None: all)."""
        return self.shared.mark_stale(signature, gpu_types)

    def record_sample(self, sample: ThroughputSample) -> None:
        """Running mode: update the entity and type tables (a zero throughput
        carries none), extend the data/wait history and the measured
        all-reduce time of the sample's shape."""
        rec = self._record_for(sample.job_id, sample.gpu_type)
        rec.version += 1
        if sample.per_gpu_throughput > 0:
            rec.entity.setdefault(sample.server_id, ThroughputTables()).add(
                sample, self.recent_weight
            )
            rec.type_layer.add(sample, self.recent_weight)
        rec.theory.samples.add(sample.data_times, sample.paired_waits(), sample.total_gpus)
        rec.theory.add_comm(sample, self.recent_weight)

    def forget(self, job_id: JobId) -> None:
        self._jobs.pop(job_id, None)

    def to_state(self) -> DatabaseState:
        records = tuple(
            rec.to_state()
            for job in sorted(self._jobs)
            for _, rec in sorted(self._jobs[job].items())
        )
        return DatabaseState(records, self.recent_weight, self.sample_window, self.datatime,
                             self.shared.to_state(), self.reuse)

    @classmethod
    def from_state(cls, state: DatabaseState) -> ThroughputDatabase:
        db = cls(state.recent_weight, state.sample_window, state.datatime, state.reuse)
        db.shared = SharedProfiles.from_state(state.shared)
        for rs in state.records:
            rec = db._record_for(rs.job_id, rs.gpu_type)
            rec.entity = {s: ThroughputTables.from_state(t) for s, t in rs.entity.items()}
            rec.type_layer = ThroughputTables.from_state(rs.type_layer)
            rec.theory.modules = rs.modules
            rec.theory.batch_size = rs.batch_size
            rec.theory.profiled_on = rs.profiled_on
            rec.theory.samples.add(rs.data_times, rs.wait_times, rs.wait_ranks or 1)
            rec.theory.comm_from_state(rs.comm)
            rec.reused = rs.reused
        return db
