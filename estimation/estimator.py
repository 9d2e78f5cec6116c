"""The throughput estimator of Hops §3.5: a top-down lookup in the
multi-layer database (entity layer → type layer → theoretical layer with the
formula of Eqs. 1-5), producing the planner's :class:`JobEstimate`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import msgspec

from estimation.database import (
    JobTypeRecord,
    RunningStat,
    TheoreticalLayer,
    ThroughputDatabase,
    ThroughputTables,
)
from estimation.datatime import DataTimeModel
from estimation.formulas import (
    collective_latency,
    comm_time,
    expected_conditional_iter_time,
    expected_iter_time,
    throughput,
)
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve, config_throughput
from shared.ids import GpuType, ServerId
from shared.job import JobSpec
from shared.measurements import TimeModules
from shared.reuse import profile_signature


class EstimatorSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Thresholds of the lookup.

    ``min_entity_samples``/``min_type_samples``: samples a table cell needs
    before it overrides the layer below. ``server_rel_threshold``: a server
    gets its own curve only when one of its trusted cells differs from the
    type value by more than this fraction — otherwise statistically
    indistinguishable servers would get slightly different curves and the
    planner could no longer group them. ``significant_digits``: every emitted
    throughput is rounded to this many digits, so that equal-in-practice
    values compare exactly equal. ``max_dist_nodes`` bounds the distributed
    curve.
    """

    min_entity_samples: int = 3
    min_type_samples: int = 1
    server_rel_threshold: float = 0.03
    significant_digits: int = 4
    max_dist_nodes: int = 16

    def __post_init__(self) -> None:
        if self.min_entity_samples < 1 or self.min_type_samples < 1:
            raise ValueError("minimum sample counts must be >= 1")
        if self.server_rel_threshold < 0:
            raise ValueError("server_rel_threshold must be >= 0")
        if self.significant_digits < 1:
            raise ValueError("significant_digits must be >= 1")
        if self.max_dist_nodes < 2:
            raise ValueError("max_dist_nodes must be >= 2")


def round_sig(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` significant digits."""
    if value == 0 or not math.isfinite(value):
        return value
    return _round_sig(value, digits)


@functools.lru_cache(maxsize=1 << 16)
def _round_sig(value: float, digits: int) -> float:
    # Memoised: a pure function of its arguments (zeros, whose sign a cache
    # keyed on == would lose, and non-finite values never get here), and the
    # estimator rounds the same formula values round after round.
    return float(f"{value:.{digits - 1}e}")


def cell_comm_time(
    spec: GpuTypeSpec, params: float, gpus: int, nodes: int, measured: float | None = None,
    buckets: int = 1,
) -> float:
    """T_c of Eq. (1) for ``gpus`` GPUs over ``nodes`` nodes: the all-reduce
    time running jobs measured for this shape when there is one (``measured``,
    see :meth:`TheoreticalLayer.measured_comm`), else Eq. (2) with the type's
    bandwidths and a latency term per gradient bucket."""
    if measured is not None:
        return measured
    return comm_time(
        params, gpus, nodes, spec.link_bandwidth, spec.net_bandwidth,
        link_latency=spec.link_latency_s, net_latency=spec.net_latency_s,
        collectives=max(1, buckets),
    )


def other_collectives_time(
    modules: TimeModules, data: DataTimeModel, spec: GpuTypeSpec, gpus: int, nodes: int
) -> float:
    """The latency of the collectives a data-parallel iteration runs besides
    the gradient all-reduce, charged in series (a departure from Eq. 1; see
    :class:`shared.measurements.TimeModules`): α per buffer broadcast, and α
    for the ranks' per-iteration agreement while no wait has been measured.
    A measured T_w was timed across that agreement, so it already holds its
    latency, and counting it again would charge it twice."""
    alpha = collective_latency(gpus, nodes, spec.link_latency_s, spec.net_latency_s)
    waits_measured = any(w > 0.0 for w in data.waits(gpus))
    meets = 1 if modules.agreement and not waits_measured else 0
    return alpha * (modules.broadcasts + meets)


def modelled_per_gpu_throughput(
    modules: TimeModules,
    data: DataTimeModel,
    batch_size: int,
    params: float,
    spec: GpuTypeSpec,
    gpus: int,
    nodes: int,
    measured_comm: float | None = None,
) -> float:
    """Eqs. (1)-(5): per-GPU throughput with ``gpus`` GPUs over ``nodes`` nodes.

    T_c from :func:`cell_comm_time` (measured, else Eq. 2), T̃c =
    ``spec.overlap_residual``·T_c; E(T_iter) from Eq. (4), each condition
    being Eq. (1) in expectation over the Eq. (3) component and its wait
    mean for ``gpus`` ranks (:meth:`DataTimeModel.waits`), plus
    :func:`other_collectives_time`; Eq. (5) gives the throughput.
    """
    t_c = cell_comm_time(spec, params, gpus, nodes, measured_comm, modules.buckets)
    serial = other_collectives_time(modules, data, spec, gpus, nodes)
    wait_cache, wait_load = data.waits(gpus)
    per_condition = [
        expected_conditional_iter_time(
            mu, sd, modules.t_f, modules.t_b, modules.t_u, wait + serial, t_c, modules.pattern,
            residual=spec.overlap_residual,
        )
        for mu, sd, wait in (
            (data.mu_cache, data.sd_cache, wait_cache),
            (data.mu_load, data.sd_load, wait_load),
        )
    ]
    return throughput(batch_size, expected_iter_time(data.p_cache, *per_condition))


def theoretical_per_gpu(
    theory: TheoreticalLayer, job: JobSpec, spec: GpuTypeSpec, gpus: int, nodes: int
) -> float:
    """The theoretical layer's answer (Figure 3 ③). The profile's batch size
    is used when given, since the time modules were measured with it."""
    return _theory_cells(theory, job, spec)(gpus, nodes)


def _theory_cells(
    theory: TheoreticalLayer, job: JobSpec, spec: GpuTypeSpec
) -> Callable[[int, int], float]:
    """:func:`theoretical_per_gpu` of one layer, job and type as a function of
    (gpus, nodes), valid while nothing is reported to the layer."""
    modules = theory.modules
    if modules is None:
        raise LookupError(f"job {job.id}: no profile on {spec.name}")
    batch = theory.batch_size or job.batch_size
    model = theory.samples.model()
    # The planner asks for the same cells every round while the fit stays put:
    # memoise per layer, valid while the modules and the fitted model are the
    # same objects (both are frozen and replaced on change) and no measured
    # all-reduce time was added (a changed T_c must not be served stale).
    basis = theory.memo_basis
    if (basis is None or basis[0] is not modules or basis[1] is not model
            or basis[2] != theory.comm_version):
        theory.memo.clear()
        theory.memo_basis = (modules, model, theory.comm_version)
    memo, params = theory.memo, job.params
    rest = (batch, params, spec.link_bandwidth, spec.net_bandwidth,
            spec.link_latency_s, spec.net_latency_s, spec.overlap_residual)

    def cell(gpus: int, nodes: int) -> float:
        key = (gpus, nodes, *rest)
        value = memo.get(key)
        if value is None:
            value = modelled_per_gpu_throughput(modules, model, batch, params, spec, gpus,
                                                nodes, theory.measured_comm(gpus, nodes))
            memo[key] = value
        return value

    return cell


def _trusted(stat: RunningStat | None, min_count: int) -> float | None:
    return stat.recent if stat is not None and stat.count >= min_count else None


class _RawCurve(msgspec.Struct, frozen=True):
    agg: tuple[float, ...]
    dist: tuple[float, ...]


def _type_curve(
    rec: JobTypeRecord, job: JobSpec, spec: GpuTypeSpec, max_k: int, max_n: int,
    settings: EstimatorSettings,
) -> _RawCurve:
    """Type layer (②) where a cell has enough samples, else the formula (③)."""
    table, need = rec.type_layer, settings.min_type_samples
    theory: Callable[[int, int], float] | None = None

    def cell(stat: RunningStat | None, gpus: int, nodes: int) -> float:
        nonlocal theory
        value = _trusted(stat, need)
        if value is not None:
            return value
        if theory is None:  # first needed here: the data-time fit stays lazy
            theory = _theory_cells(rec.theory, job, spec)
        return theory(gpus, nodes)

    # Across nodes Eq. (2) ignores the GPU count, so n GPUs stand in for any
    # (and a T_c measured on n nodes with one GPU each applies to the cell).
    return _RawCurve(
        agg=tuple(cell(table.agg.get(k), k, 1) for k in range(1, max_k + 1)),
        dist=tuple(cell(table.dist.get(n), n, n) for n in range(2, max_n + 1)),
    )


def _server_curve(
    tables: ThroughputTables, base: _RawCurve, settings: EstimatorSettings
) -> ThroughputCurve | None:
    """Entity layer (①): the server's own curve, or None when no trusted cell
    differs from the type value by more than the threshold."""
    need, limit = settings.min_entity_samples, settings.server_rel_threshold
    differs = False

    def merge(stats: dict[int, RunningStat], values: tuple[float, ...], first: int) -> list[float]:
        # Only the cells the table holds can change (most servers hold one or
        # two of the curve's cells), so walk the table, not the curve.
        nonlocal differs
        out = list(values)
        for key, stat in stats.items():
            i = key - first
            own = _trusted(stat, need) if 0 <= i < len(values) else None
            if own is None:
                continue
            type_value = values[i]
            out[i] = own
            if abs(own - type_value) > limit * abs(type_value):
                differs = True
        return out

    agg = merge(tables.agg, base.agg, 1)
    dist = merge(tables.dist, base.dist, 2)
    return _rounded(_RawCurve(tuple(agg), tuple(dist)), settings) if differs else None


def _rounded(curve: _RawCurve, settings: EstimatorSettings) -> ThroughputCurve:
    digits = settings.significant_digits
    return ThroughputCurve(
        # round_sig, its guard inline: this rounds every value of every curve.
        agg=tuple([v if v == 0 or not math.isfinite(v) else _round_sig(v, digits)
                   for v in curve.agg]),
        dist=tuple([v if v == 0 or not math.isfinite(v) else _round_sig(v, digits)
                    for v in curve.dist]),
    )


def estimate_job(
    db: ThroughputDatabase,
    job: JobSpec,
    cluster: Cluster,
    settings: EstimatorSettings | None = None,
) -> JobEstimate:
    """§3.5 top-down lookup for every GPU type of ``cluster``.

    ``by_type[t].agg[k-1]`` covers k = 1..max GPUs of a server of type t;
    ``by_type[t].dist[n-2]`` covers n = 2..min(#servers of t, max_dist_nodes).
    Types without a profile for the job (its own, or with reuse its
    signature's shared one) are left out. ``by_server`` holds
    complete curves for servers whose entity layer measurably differs.
    """
    cfg = settings or EstimatorSettings()
    by_type: dict[GpuType, ThroughputCurve] = {}
    by_server: dict[ServerId, ThroughputCurve] = {}
    signature = profile_signature(job) if db.reuse else None
    for spec in cluster.gpu_types:
        rec = db.estimate_record(job.id, signature, spec.name)
        servers = tuple(cluster.servers_of_type(spec.name))
        if rec is None or rec.theory.modules is None or not servers:
            continue
        curve, own = _type_curves(rec, job, spec, servers, cfg)
        by_type[spec.name] = curve
        by_server.update(own)
    return JobEstimate(job.id, by_type, by_server)


_Curves = tuple[ThroughputCurve, dict[ServerId, ThroughputCurve]]


def _type_curves(
    rec: JobTypeRecord, job: JobSpec, spec: GpuTypeSpec, servers: Sequence[Server],
    cfg: EstimatorSettings,
) -> _Curves:
    """The type's curve and its servers' own curves, memoised on the record:
    they are a function of the record (its version counts every report), the
    job, the type and the servers, and most records get no report in a round
    (a running job reports on one type only)."""
    key = (rec.version, job, spec, tuple(s.id for s in servers), cfg)
    memo = rec.memo
    if isinstance(memo, tuple) and memo[0] == key:
        cached: _Curves = memo[1]
        return cached
    max_k = max(s.gpus for s in servers)
    max_n = min(len(servers), cfg.max_dist_nodes)
    base = _type_curve(rec, job, spec, max_k, max_n, cfg)
    own: dict[ServerId, ThroughputCurve] = {}
    for server in servers:
        tables = rec.entity.get(server.id)
        curve = _server_curve(tables, base, cfg) if tables is not None else None
        if curve is not None:
            own[server.id] = curve
    result = (_rounded(base, cfg), own)
    rec.memo = (key, result)
    return result


def predict(
    db: ThroughputDatabase,
    job: JobSpec,
    cluster: Cluster,
    config: Configuration,
    settings: EstimatorSettings | None = None,
) -> float:
    """§3.5 configuration throughput (samples/s) of ``job`` under ``config``.

    Raises LookupError when a server of ``config`` has a GPU type the job
    has not been profiled on.
    """
    est = estimate_job(db, job, cluster, settings)
    for sid in config.servers:
        gpu_type = cluster.by_id[sid].gpu_type
        if gpu_type not in est.by_type:
            raise LookupError(f"job {job.id}: no profile on {gpu_type} (server {sid})")
    return config_throughput(est, cluster, config)
