"""Ground truth of the world model: how fast a job really runs in a configuration.

The simulator and the emulated executors both advance jobs at these rates.
Deliberately not the estimator's formula (services/estimator), so that the
simulator tests the estimator instead of agreeing with it by construction.
It keeps the structure of Hops §3.5 (data, forward, backward, communication,
update and wait; the two overlap patterns of Eq. 1; the bimodal data time of
Eq. 3) but differs in the parts the paper leaves open:

* communication is ring all-reduce: every rank sends 2(N-1)/N of the
  gradients over the slowest link of the ring, plus a latency per ring step
  and gradient bucket. The cluster spec's bandwidths are read as what the
  paper's offline calibration of Eq. (2) yields: inside a server Eq. (2)'s
  (N-1)/N is the ring's 2(N-1)/N at half the bus bandwidth, so the bus runs
  at twice ``link_bandwidth``; between servers Eq. (2) was fitted on two
  nodes, where the ring's 2(N-1)/N is 1, so the bus runs at
  ``net_bandwidth``, and with more ranks the ring's traffic grows towards
  twice what Eq. (2) assumes;
* 30% of the communication is not hidden behind backward (the paper's 0.2
  is its estimate, §3.5);
* waits grow with the number of ranks and data loading slows when several of
  a job's GPUs share one host's CPUs;
* servers of one GPU type differ by their attributes (see :func:`host_factors`);
* Gavel's job types follow their measured scaling (consolidated on one
  server, unconsolidated across servers) rather than the module model.

Randomness only comes from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import median
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ProfileReport, ThroughputSample, TimeModules
from world.catalog import DataSource, ModelTruth, TypeTruth

Array = npt.NDArray[np.float64]

OVERLAP_NOT_HIDDEN = 0.3
INTRA_BUS_FACTOR = 2.0  # bus bandwidth inside a server / spec link_bandwidth
BUCKET_PARAMS = 25 * 2**20 / 4  # PyTorch DDP's 25 MiB gradient buckets, fp32
STEP_LATENCY_INTRA_S = 10e-6
STEP_LATENCY_INTER_S = 25e-6
WAIT_GROWTH = 0.25  # extra wait per doubling of the ranks
DATA_CONTENTION = 0.02  # slower input pipeline per further local GPU of the job
PROFILE_STARTUP_S = 20.0
MODULE_NOISE = 0.02  # relative noise of profiled t_f, t_b, t_u
WAIT_NOISE = 0.3  # relative noise of one wait observation
THROUGHPUT_NOISE_FLOOR = 0.01  # relative noise of a measured throughput

# Host rules (docs/simulator-data.md): RTX3090 in a Sugon W780-G is the paper's
# older "RTX3090old" (PCIe 3.0 Skylake host, tighter power/cooling budget).
OLD_RTX3090 = ("Sugon W780-G", "RTX3090")
OLD_RTX3090_COMPUTE = 1.12
# Input-pipeline time by host CPU relative to the catalog's reference host
# (2x Xeon Gold 5118, 12 cores each): roughly inverse to the cores' throughput.
CPU_DATA_FACTOR = (("5118", 1.0), ("5218", 0.85), ("5320", 0.7))


class HostFactors(NamedTuple):
    """Multipliers of a server's compute time (t_f, t_b, t_u) and data time."""

    compute: float
    data: float


REFERENCE_HOST = HostFactors(1.0, 1.0)


def host_factors(server: Server, extra: float = 1.0) -> HostFactors:
    """The rule keyed on ``server.model``/``server.cpu``; ``extra`` multiplies
    the compute factor (the caller's per-entity factor)."""
    compute = OLD_RTX3090_COMPUTE if (server.model, server.gpu_type) == OLD_RTX3090 else 1.0
    data = next((f for key, f in CPU_DATA_FACTOR if key in server.cpu), 1.0)
    return HostFactors(compute * extra, data)


def expected_max(mu: float, sd: float, c: float) -> float:
    """E[max(X, c)] for X ~ N(mu, sd)."""
    if sd <= 0:
        return max(mu, c)
    z = (c - mu) / sd
    cdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return c * cdf + mu * (1.0 - cdf) + sd * pdf


def wait_growth(total_gpus: int) -> float:
    return 1.0 + WAIT_GROWTH * math.log2(total_gpus)


def ring_allreduce_time(params: float, gpus: int, nodes: int, link: float, net: float) -> float:
    """Seconds for one all-reduce of ``params`` fp32 gradients over ``gpus``
    ranks on ``nodes`` servers; ``link``/``net`` are the slowest spec
    bandwidths (params/s) inside a server and between servers."""
    if gpus <= 1:
        return 0.0
    bus = INTRA_BUS_FACTOR * link if nodes == 1 else min(INTRA_BUS_FACTOR * link, net)
    alpha = STEP_LATENCY_INTRA_S if nodes == 1 else STEP_LATENCY_INTER_S
    buckets = math.ceil(params / BUCKET_PARAMS)
    return 2.0 * (gpus - 1) / gpus * params / bus + 2 * (gpus - 1) * buckets * alpha


class _Modules(NamedTuple):
    t_f: float
    t_b: float
    t_u: float


def _conditional_times(tt: TypeTruth, f: HostFactors, t_c: float, total: int,
                       local: int) -> tuple[float, float]:
    """Expected iteration time when the data hits / misses the cache."""
    m = _Modules(tt.t_f * f.compute, tt.t_b * f.compute, tt.t_u * f.compute)
    d = f.data * (1.0 + DATA_CONTENTION * (local - 1))
    grow = wait_growth(total)
    sync = max(m.t_b + OVERLAP_NOT_HIDDEN * t_c, t_c)
    ds = tt.data

    def one(mu: float, sd: float, wait: float) -> float:
        if tt.pattern == 1:
            return m.t_f + expected_max(mu * d, sd * d, sync + m.t_u) + wait * grow
        return mu * d + m.t_f + sync + m.t_u + wait * grow

    return one(ds.mu_cache, ds.sd_cache, ds.wait_cache), one(ds.mu_load, ds.sd_load, ds.wait_load)


def _interp_log2(points: Mapping[int, float], n: int) -> float:
    """Linear in log2(n) between measured points, flat beyond them."""
    keys = sorted(points)
    if n <= keys[0]:
        return points[keys[0]]
    if n >= keys[-1]:
        return points[keys[-1]]
    hi = next(k for k in keys if k >= n)
    lo = max(k for k in keys if k <= n)
    if hi == lo:
        return points[lo]
    w = (math.log2(n) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return points[lo] + w * (points[hi] - points[lo])


def _draw_data(ds: DataSource, scale: float, grow: float, iters: int,
               rng: np.random.Generator) -> tuple[Array, Array]:
    """``iters`` data times from Eq. (3) and the paired waits."""
    hit = rng.random(iters) < ds.p_cache
    mu = np.where(hit, ds.mu_cache, ds.mu_load) * scale
    sd = np.where(hit, ds.sd_cache, ds.sd_load) * scale
    data = np.maximum(mu + sd * rng.standard_normal(iters), 0.0)
    wait_mean = np.where(hit, ds.wait_cache, ds.wait_load) * grow
    waits = np.maximum(wait_mean * (1.0 + WAIT_NOISE * rng.standard_normal(iters)), 0.0)
    return data, waits


def _pace(times: list[tuple[float, float, float]]) -> float:
    """Seconds per iteration: the slowest server's expected time."""
    return max(p * c + (1.0 - p) * lo for p, c, lo in times)


class GroundTruth:
    """True speed of every catalog model on every server of ``cluster``.

    ``entity_factors`` optionally multiplies a server's compute time on top
    of the host rules (e.g. a throttled server)."""

    def __init__(self, cluster: Cluster, catalog: Mapping[str, ModelTruth],
                 entity_factors: Mapping[ServerId, float] | None = None) -> None:
        extra = dict(entity_factors or {})
        unknown = sorted(set(extra) - set(cluster.by_id))
        if unknown:
            raise ValueError(f"entity_factors: unknown server {unknown[0]!r}")
        if any(f <= 0 for f in extra.values()):
            raise ValueError("entity_factors must be > 0")
        self.cluster = cluster
        self.catalog: dict[str, ModelTruth] = dict(catalog)
        self._hosts = {s.id: host_factors(s, extra.get(s.id, 1.0)) for s in cluster.servers}
        self._tables: dict[tuple[str, GpuType], tuple[dict[int, float], dict[int, float]]] = {}
        # single_gpu_throughput per (model, type): a function of the fixed truth.
        self._single: dict[tuple[str, GpuType], float] = {}

    # --- lookups -------------------------------------------------------------------

    def supports(self, model: str, gpu_type: GpuType) -> bool:
        m = self.catalog.get(model)
        return m is not None and gpu_type in m.by_type

    def _model(self, model: str) -> ModelTruth:
        m = self.catalog.get(model)
        if m is None:
            raise ValueError(f"unknown model {model!r}")
        return m

    def _type(self, m: ModelTruth, gpu_type: GpuType) -> TypeTruth:
        tt = m.by_type.get(gpu_type)
        if tt is None:
            raise ValueError(f"model {m.name} does not run on {gpu_type}")
        return tt

    def _server(self, sid: ServerId) -> Server:
        server = self.cluster.by_id.get(sid)
        if server is None:
            raise ValueError(f"unknown server {sid!r}")
        return server

    def _spec(self, server: Server) -> GpuTypeSpec:
        return self.cluster.type_by_name[server.gpu_type]

    # --- expected times ------------------------------------------------------------

    def _comm(self, m: ModelTruth, config: Configuration) -> float:
        specs = [self._spec(self._server(s)) for s in config.servers]
        return ring_allreduce_time(
            m.params, config.total_gpus, config.num_nodes,
            min(t.link_bandwidth for t in specs), min(t.net_bandwidth for t in specs),
        )

    def _measured(self, m: ModelTruth, tt: TypeTruth, spec: GpuTypeSpec
                  ) -> tuple[dict[int, float], dict[int, float]]:
        """Iteration times on the type's reference server at 1, 2, 4, 8 GPUs,
        consolidated and one per server: measured where Gavel measured them,
        the module model elsewhere."""
        key = (m.name, spec.name)
        if key not in self._tables:
            def filled(points: dict[int, float], spread: bool) -> dict[int, float]:
                out: dict[int, float] = {}
                for n in ((2, 4, 8) if spread else (1, 2, 4, 8)):
                    if n in points:
                        out[n] = m.batch_size / points[n]
                        continue
                    nodes = n if spread else 1
                    t_c = ring_allreduce_time(m.params, n, nodes, spec.link_bandwidth,
                                              spec.net_bandwidth)
                    c, lo = _conditional_times(tt, REFERENCE_HOST, t_c, n, 1 if spread else n)
                    out[n] = tt.data.p_cache * c + (1.0 - tt.data.p_cache) * lo
                return out

            self._tables[key] = (filled(tt.consolidated, False), filled(tt.unconsolidated, True))
        return self._tables[key]

    def _server_time(self, m: ModelTruth, server: Server, local: int, config: Configuration,
                     t_c: float) -> tuple[float, float, float]:
        """(p_cache, cache-hit time, miss time) of one server in ``config``."""
        tt = self._type(m, server.gpu_type)
        f = self._hosts[server.id]
        if tt.consolidated:
            cons, spread = self._measured(m, tt, self._spec(server))
            # Any placement over several servers runs its ring over the network,
            # so it follows the one-GPU-per-server measurements.
            table = cons if config.num_nodes == 1 else spread
            t = _interp_log2(table, config.total_gpus) * f.compute
            return 1.0, t, t
        c, lo = _conditional_times(tt, f, t_c, config.total_gpus, local)
        return tt.data.p_cache, c, lo

    def _times(self, model: str, config: Configuration) -> list[tuple[float, float, float]]:
        m = self._model(model)
        t_c = self._comm(m, config)
        return [self._server_time(m, self._server(s), g, config, t_c) for s, g in config.parts]

    def iteration_time(self, model: str, config: Configuration) -> float:
        """Expected seconds per iteration of the data-parallel job (Eq. 4 in
        spirit); the slowest server sets the pace (§3.5)."""
        return _pace(self._times(model, config))

    def throughput(self, model: str, config: Configuration) -> float:
        """Samples/s of the whole job."""
        m = self._model(model)
        return m.batch_size * config.total_gpus / self.iteration_time(model, config)

    def per_gpu_throughput(self, model: str, config: Configuration, server: ServerId) -> float:
        """What ``server``'s GPUs achieve in ``config``: synchronous data
        parallelism runs every rank at the job's pace."""
        if server not in config.as_dict():
            raise ValueError(f"server {server!r} is not part of configuration {config}")
        return self.throughput(model, config) / config.total_gpus

    def single_gpu_throughput(self, model: str, gpu_type: GpuType) -> float:
        """Samples/s on one GPU of a typical server of the type: the median over
        the cluster's servers of the type, the reference server if none."""
        key = (model, gpu_type)
        if key not in self._single:
            self._single[key] = self._single_gpu_throughput(model, gpu_type)
        return self._single[key]

    def _single_gpu_throughput(self, model: str, gpu_type: GpuType) -> float:
        m = self._model(model)
        self._type(m, gpu_type)
        servers = [s.id for s in self.cluster.servers_of_type(gpu_type)]
        if servers:
            return median(self.throughput(model, Configuration.of({s: 1})) for s in servers)
        tt = m.by_type[gpu_type]
        if tt.consolidated:
            return tt.consolidated[1]
        c, lo = _conditional_times(tt, REFERENCE_HOST, 0.0, 1, 1)
        return m.batch_size / (tt.data.p_cache * c + (1.0 - tt.data.p_cache) * lo)

    # --- observations --------------------------------------------------------------

    def profile(self, job_id: JobId, model: str, server: ServerId, iters: int,
                rng: np.random.Generator) -> tuple[ProfileReport, float]:
        """A profiling-mode run on one GPU of ``server`` (§3.2): the stable
        modules with small noise, ``iters`` data times from the true Eq. (3)
        source with their waits, and the run's length: a fixed start-up plus
        the sampled iterations."""
        if iters < 0:
            raise ValueError(f"iters must be >= 0, got {iters}")
        m = self._model(model)
        srv = self._server(server)
        tt = self._type(m, srv.gpu_type)
        f = self._hosts[srv.id]
        noise = np.maximum(1.0 + MODULE_NOISE * rng.standard_normal(3), 0.5)
        t_f, t_b, t_u = (float(x) * f.compute * float(k)
                         for x, k in zip((tt.t_f, tt.t_b, tt.t_u), noise, strict=True))
        data, waits = _draw_data(tt.data, f.data, 1.0, iters, rng)
        if tt.pattern == 1:
            iter_times = t_f + np.maximum(data, t_b + t_u) + waits
        else:
            iter_times = data + t_f + t_b + t_u + waits
        modules = TimeModules(
            t_f=t_f, t_b=t_b, t_u=t_u, pattern=tt.pattern,
            t_d=tuple(float(x) for x in data), t_w=tuple(float(x) for x in waits),
        )
        report = ProfileReport(job_id, srv.gpu_type, srv.id, modules, m.batch_size)
        return report, PROFILE_STARTUP_S + float(iter_times.sum())

    def _noise(self, times: list[tuple[float, float, float]], iters: int) -> float:
        """Relative noise of a throughput measured over ``iters`` iterations:
        the spread between the two data conditions of the pacing server shrinks
        with 1/sqrt(iters), on top of a floor."""
        p, c, lo = max(times, key=lambda t: t[0] * t[1] + (1.0 - t[0]) * t[2])
        mean = p * c + (1.0 - p) * lo
        cv = math.sqrt(p * (1.0 - p)) * abs(lo - c) / mean
        return THROUGHPUT_NOISE_FLOOR + cv / math.sqrt(max(iters, 1))

    def running_samples(self, job_id: JobId, model: str, config: Configuration, iters: int,
                        rng: np.random.Generator) -> list[ThroughputSample]:
        """Running-mode reports of ``config`` after ``iters`` iterations, one per
        server: the measured per-GPU throughput (noisy, unbiased) and that
        server's data and wait observations (§3.2)."""
        if iters < 0:
            raise ValueError(f"iters must be >= 0, got {iters}")
        m = self._model(model)
        times = self._times(model, config)
        # throughput(model, config), from the times already at hand.
        per_gpu = m.batch_size * config.total_gpus / _pace(times) / config.total_gpus
        sigma = self._noise(times, iters)
        grow = wait_growth(config.total_gpus)
        out: list[ThroughputSample] = []
        for sid, local in config.parts:
            srv = self._server(sid)
            ds = m.by_type[srv.gpu_type].data
            scale = self._hosts[sid].data * (1.0 + DATA_CONTENTION * (local - 1))
            data, waits = _draw_data(ds, scale, grow, iters, rng)
            measured = per_gpu * max(0.5, 1.0 + sigma * float(rng.standard_normal()))
            out.append(ThroughputSample(
                job_id=job_id, server_id=sid, gpu_type=srv.gpu_type, local_gpus=local,
                nodes=config.num_nodes, total_gpus=config.total_gpus,
                per_gpu_throughput=measured,
                data_times=tuple(data.tolist()), wait_times=tuple(waits.tolist()),
            ))
        return out
