"""Sia's own throughput model, bootstrapped from one-GPU profiles (Sia §3.2;
the artifact's ``sia-simulator/goodput.py`` ``fit_perf_params`` and
``sia.py`` ``_compute_goodputs``), instead of Hops' estimator.

What Sia knows of a job: its throughput on one GPU of each type (the
profiles) and what it measured of the configurations the job has run. From
that, per GPU type:

* a sample's time on one GPU is ``c = 1 / T1`` (the profile), and on ``n``
  GPUs over ``k`` nodes each GPU adds a synchronisation time per sample,
  ``s = a + b (n - 2)``, with ``(a, b)`` for one node and another pair for
  several (Pollux's model, which Sia's artifact fits; its overlap exponent
  is taken as 1 here, so step time is compute plus sync). Per-GPU
  throughput is ``1 / (c + s)``;
* the pairs are fitted by least squares to the measured configurations of
  that type. As in ``fit_perf_params``: with no measurement of a regime its
  pair stays at zero (the model is optimistic: linear scaling), ``b`` stays
  at zero while no measurement has more than two GPUs, and without
  multi-node measurements the multi-node pair is at least 1.1 times the
  one-node pair;
* a type where the job never ran on several GPUs borrows the scaling of the
  type where it ran on most configurations, scaled by the ratio of their
  one-GPU throughputs (the artifact's projection, ``cluster_throughput_ratios``);
  with no multi-GPU measurement anywhere every type scales linearly, the
  "crude bootstrapped throughput model" Hops §2.1 blames for Sia's mistakes.

Measurements come from the snapshot (``JobState.throughput`` of running
jobs, type-level: Sia sees GPU types only) and are kept in the policy's
state between plans (:class:`Observations`).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from shared.cluster import Cluster
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId
from shared.snapshot import Snapshot

STATE = "sia-throughput"  # the LayerRecord name its state travels under
MULTI_NODE_PRIOR = 1.1  # fit_perf_params: multi-node sync >= 1.1 x one-node
KEEP = 4096  # jobs remembered (running ones are measured again each plan)


class Measured(msgspec.Struct, frozen=True, array_like=True):
    """A configuration the job ran: per-GPU samples/s on ``gpus`` GPUs of
    ``gpu_type`` over ``nodes`` servers."""

    gpu_type: GpuType
    gpus: int
    nodes: int
    per_gpu: float


class Observations(msgspec.Struct, frozen=True):
    """What Sia measured of each job, the last value per configuration."""

    jobs: dict[JobId, tuple[Measured, ...]] = {}


def decode(blob: bytes | None) -> Observations:
    return msgspec.msgpack.decode(blob, type=Observations) if blob else Observations()


def encode(obs: Observations) -> bytes:
    return msgspec.msgpack.encode(obs)


class StateCodec:
    """:func:`decode` and :func:`encode` that remember the last state
    encoded: the next plan usually hands back those very bytes, and decoding
    thousands of jobs' measurements each plan was 6% of a trace's run. The
    bytes are compared, so a state from elsewhere (a failover, a layer that
    calls the policy per tenant) is decoded as before."""

    def __init__(self) -> None:
        self._last: tuple[bytes, Observations] | None = None

    def decode(self, blob: bytes | None) -> Observations:
        if blob and self._last is not None and self._last[0] == blob:
            return self._last[1]
        return decode(blob)

    def encode(self, obs: Observations) -> bytes:
        blob = encode(obs)
        self._last = (blob, obs)
        return blob


def observe(obs: Observations, snapshot: Snapshot) -> Observations:
    """``obs`` with every measured running job's configuration. Jobs the
    snapshot does not show are kept (a layer may show the policy part of
    the cluster, as HiveD shows each tenant its cells); the
    :data:`KEEP` most recently measured jobs are remembered."""
    jobs = dict(obs.jobs)
    for j in snapshot.jobs:
        config = j.current
        if j.phase != "running" or config is None or j.throughput <= 0 or not config.total_gpus:
            continue
        types = {snapshot.cluster.by_id[s].gpu_type for s in config.servers
                 if s in snapshot.cluster.by_id}
        if len(types) != 1:
            continue
        m = Measured(types.pop(), config.total_gpus, config.num_nodes,
                     j.throughput / config.total_gpus)
        kept = tuple(x for x in jobs.get(j.id, ()) if (x.gpu_type, x.gpus, x.nodes)
                     != (m.gpu_type, m.gpus, m.nodes))
        jobs.pop(j.id, None)  # to the end: the most recently measured
        jobs[j.id] = tuple(sorted((*kept, m), key=lambda x: (x.gpu_type, x.gpus, x.nodes)))
    return Observations(dict(list(jobs.items())[-KEEP:]))


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``s = a + b (n - 2)`` over ``(n, s)``,
    both >= 0; ``b`` = 0 while no point has more than two GPUs, or all
    have one size."""
    if not points:
        return 0.0, 0.0
    xs = [n - 2.0 for n, _ in points]
    ys = [s for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if all(n <= 2 for n, _ in points) or var <= 0:  # one size seen: no slope to fit
        return max(0.0, my), 0.0
    b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var)
    return max(0.0, my - b * mx), b


class TypeModel(msgspec.Struct, frozen=True):
    """One type's fitted model: one-GPU seconds per sample and the two sync pairs."""

    compute: float
    one_node: tuple[float, float]
    multi_node: tuple[float, float]

    def per_gpu(self, gpus: int, nodes: int) -> float:
        if gpus <= 1:
            return 1.0 / self.compute
        a, b = self.one_node if nodes <= 1 else self.multi_node
        return 1.0 / (self.compute + a + b * (gpus - 2))


def fit_type(single: float, measured: Iterable[Measured]) -> TypeModel:
    """The type's model from its one-GPU throughput and its measurements."""
    compute = 1.0 / single
    one: list[tuple[int, float]] = []
    multi: list[tuple[int, float]] = []
    for m in measured:
        if m.gpus >= 2 and m.per_gpu > 0:
            (one if m.nodes == 1 else multi).append((m.gpus, max(0.0, 1.0 / m.per_gpu - compute)))
    one_pair = _fit(one)
    multi_pair = _fit(multi) if multi else (one_pair[0] * MULTI_NODE_PRIOR,
                                             one_pair[1] * MULTI_NODE_PRIOR)
    return TypeModel(compute, one_pair, multi_pair)


def _curve(model: TypeModel, per_node: int, nodes: int, scale: float = 1.0) -> ThroughputCurve:
    """A curve over ``per_node`` GPUs on one server and 2..``nodes`` whole
    servers (Sia's configurations take whole servers beyond one)."""
    agg = tuple(scale * model.per_gpu(g, 1) for g in range(1, per_node + 1))
    dist = tuple(scale * model.per_gpu(k * per_node, k) for k in range(2, nodes + 1))
    return ThroughputCurve(agg, dist)


def bootstrapped(est: JobEstimate, measured: tuple[Measured, ...],
                 cluster: Cluster) -> JobEstimate:
    """Sia's view of the job: per type, the curve of its own model, or the
    projection of the type it ran most on (see the module). Types without a
    one-GPU profile are left out, as Sia cannot place the job there."""
    single = {t: c.agg_per_gpu(1) for t, c in est.by_type.items() if c.agg and c.agg[0] > 0}
    scaled = {t for t in single if any(m.gpu_type == t and m.gpus >= 2 for m in measured)}
    models = {t: fit_type(single[t], (m for m in measured if m.gpu_type == t)) for t in single}
    donor = max(sorted(scaled), key=lambda t: sum(m.gpu_type == t for m in measured),
                default=None)
    curves: dict[GpuType, ThroughputCurve] = {}
    for t in sorted(single):
        per_node = cluster.max_server_gpus(t)
        nodes = max(1, sum(1 for _ in cluster.servers_of_type(t)))
        if t in scaled or donor is None:
            curves[t] = _curve(models[t], per_node, nodes)
        else:
            curves[t] = _curve(models[donor], per_node, nodes, single[t] / single[donor])
    return JobEstimate(est.job_id, curves)
