"""Configuration generation (Hops §3.4 and §3.6 "Configuration generation").

:func:`generate_configs` is the paper's rule, literally: location-specific
configurations ``{server: gpus}`` per GPU type, aggregated on one server or,
for jobs that tolerate it, distributed over adjacent servers, so a job has
O(N_type) configurations per requirement.

:mod:`scheduling.policies.hops.classes` describes the same space up to symmetry,
for the class formulation of the ILP.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Iterator, Mapping, Sequence

import msgspec

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve, sensitivity
from shared.ids import GpuType, ServerId

DEFAULT_SIGMA = 1.4


class Candidate(msgspec.Struct, frozen=True):
    """One generated configuration and its §3.5 throughput."""

    config: Configuration
    throughput: float
    gpu_type: GpuType


def is_high_sensitivity(
    rho: Mapping[GpuType, float], est: JobEstimate, gpu_type: GpuType, sigma: float
) -> bool:
    """rho (Eq. 10) above the threshold sigma; a missing rho is computed here."""
    value = rho.get(gpu_type)
    if value is None:
        value = sensitivity(est, gpu_type) if gpu_type in est.by_type else math.inf
    return value > sigma


def distributed_allowed(requirements: Sequence[int], r_k: int, high: bool, largest: int) -> bool:
    """§3.6: low-sensitivity jobs may go distributed; a high-sensitivity job
    only when its minimum requirement R_1 exceeds the type's largest server,
    and then only for requirements no single server can hold."""
    if not high:
        return True
    return min(requirements) > largest and r_k > largest


def largest_servers(cluster: Cluster) -> dict[GpuType, int]:
    """GPUs of each type's largest server, in one sweep over the cluster."""
    out: dict[GpuType, int] = {}
    for s in cluster.servers:
        out[s.gpu_type] = max(out.get(s.gpu_type, 0), s.gpus)
    return out


def job_curve(est: JobEstimate, server: ServerId, gpu_type: GpuType) -> ThroughputCurve | None:
    """The job's curve on ``server`` (entity layer first, then type layer, §3.3)."""
    own = est.by_server.get(server)
    return own if own is not None else est.by_type.get(gpu_type)


def usable_servers(
    cluster: Cluster, free: Mapping[ServerId, int], est: JobEstimate, gpu_type: GpuType
) -> list[tuple[ServerId, int]]:
    """Servers of ``gpu_type`` with idle GPUs (S_t > 0) that the job has a
    curve for, in cluster order: the order adjacency is defined on."""
    return [
        (s.id, free.get(s.id, 0))
        for s in cluster.servers_of_type(gpu_type)
        if free.get(s.id, 0) > 0 and job_curve(est, s.id, gpu_type) is not None
    ]


def _distributed(
    servers: Sequence[tuple[ServerId, int]], r_k: int
) -> Iterator[tuple[Configuration, int]]:
    """Fill adjacent servers from each start position, each node with all its
    idle GPUs, the last one partly: one configuration (with its node count)
    per start, O(N_type)."""
    prefix = [0]
    for _, idle in servers:
        prefix.append(prefix[-1] + idle)
    for start in range(len(servers)):
        if prefix[-1] - prefix[start] < r_k:
            # Stop rule: every later start has even fewer GPUs after it.
            break
        # The last node: the first where the run's idle GPUs reach r_k.
        last = bisect.bisect_left(prefix, prefix[start] + r_k) - 1
        if last > start:
            tail = (servers[last][0], r_k - prefix[last] + prefix[start])
            yield _over_run((*servers[start:last], tail)), last - start + 1


# Passes generate the same configurations round after round; they are frozen
# values, so one instance per distinct configuration serves every pass and
# spares rebuilding and revalidating it.
@functools.lru_cache(maxsize=1 << 14)
def _on_server(server: ServerId, gpus: int) -> Configuration:
    return Configuration(((server, gpus),))


@functools.lru_cache(maxsize=1 << 16)
def _over_run(parts: tuple[tuple[ServerId, int], ...]) -> Configuration:
    # Distinct servers, so sorting the pairs sorts by server id.
    return Configuration(tuple(sorted(parts)))


def generate_configs(
    cluster: Cluster,
    free: Mapping[ServerId, int],
    requirements: Sequence[int],
    rho: Mapping[GpuType, float],
    est: JobEstimate,
    sigma: float = DEFAULT_SIGMA,
    largest: Mapping[GpuType, int] | None = None,
) -> tuple[Candidate, ...]:
    """§3.6 configuration generation for one job; throughput by §3.5.

    Per GPU type: aggregated ``{t: R_k}`` for every server with R_k <= S_t;
    distributed over adjacent servers when :func:`distributed_allowed`.
    Configurations with zero throughput are dropped. (No duplicates arise:
    types hold disjoint servers, requirements differ in size, and adjacent
    runs from different starts differ in their first server.)
    ``largest`` (from :func:`largest_servers`) saves a sweep per call.
    """
    largest = largest if largest is not None else largest_servers(cluster)
    out: list[Candidate] = []
    reqs = sorted(set(requirements))
    for spec in cluster.gpu_types:
        servers, curves = _type_servers(cluster, free, est, spec.name)
        if not servers:
            continue
        # One curve for all (no server curve here): a config's §3.5 minimum is
        # that curve's value.
        base = est.by_type.get(spec.name) if not curves else None
        high = is_high_sensitivity(rho, est, spec.name, sigma)
        for r_k in reqs:
            agg = base.agg_per_gpu(r_k) * r_k if base is not None else 0.0
            for sid, idle in servers:
                if r_k <= idle:
                    tput = agg if base is not None else curves[sid].agg_per_gpu(r_k) * r_k
                    if tput > 0:
                        out.append(Candidate(_on_server(sid, r_k), tput, spec.name))
            if distributed_allowed(requirements, r_k, high, largest.get(spec.name, 0)):
                for config, n in _distributed(servers, r_k):
                    slowest = (base.dist_per_gpu(n) if base is not None
                               else min(curves[s].dist_per_gpu(n) for s, _ in config.parts))
                    if (tput := slowest * r_k) > 0:
                        out.append(Candidate(config, tput, spec.name))
    return tuple(out)


def _type_servers(
    cluster: Cluster, free: Mapping[ServerId, int], est: JobEstimate, gpu_type: GpuType
) -> tuple[list[tuple[ServerId, int]], dict[ServerId, ThroughputCurve]]:
    """:func:`usable_servers` (idle GPUs as ints, as Configuration.of stores
    them), and each one's curve as config_throughput reads it, or no curves
    when every one of them is the type's curve."""
    base, own = est.by_type.get(gpu_type), est.by_server
    if base is not None and not own:
        idle = [(s.id, free.get(s.id, 0)) for s in cluster.servers_of_type(gpu_type)]
        return [(sid, int(g)) for sid, g in idle if g > 0], {}
    servers, curves = [], {}
    for s in cluster.servers_of_type(gpu_type):
        g, curve = free.get(s.id, 0), own.get(s.id)
        curve = base if curve is None else curve
        if g > 0 and curve is not None:
            servers.append((s.id, int(g)))
            curves[s.id] = curve
    uniform = base is not None and all(c is base for c in curves.values())
    return servers, ({} if uniform else curves)


class FreeIndex:
    """Per-type idle-GPU summaries for counting configurations cheaply, so the
    formulation can be chosen before anything is generated."""

    def __init__(self, cluster: Cluster, free: Mapping[ServerId, int]) -> None:
        self._cluster = cluster
        self._largest = largest_servers(cluster)
        self._sorted: dict[GpuType, list[int]] = {}
        self._neg_suffix: dict[GpuType, list[int]] = {}
        for spec in cluster.gpu_types:
            idle = [free.get(s.id, 0) for s in cluster.servers_of_type(spec.name)]
            idle = [g for g in idle if g > 0]
            self._sorted[spec.name] = sorted(idle)
            suffix, acc = [], 0
            for g in reversed(idle):
                acc += g
                suffix.append(-acc)
            # suffix sums shrink with the start position; negated and reversed
            # they are ascending, ready for bisect.
            self._neg_suffix[spec.name] = sorted(suffix)

    def count(
        self,
        requirements: Sequence[int],
        rho: Mapping[GpuType, float],
        est: JobEstimate,
        sigma: float = DEFAULT_SIGMA,
    ) -> int:
        """An upper bound on ``len(generate_configs(...))``."""
        total = 0
        for spec in self._cluster.gpu_types:
            if spec.name not in est.by_type and not est.by_server:
                continue
            high = is_high_sensitivity(rho, est, spec.name, sigma)
            largest = self._largest.get(spec.name, 0)
            idle, neg = self._sorted[spec.name], self._neg_suffix[spec.name]
            for r_k in set(requirements):
                total += len(idle) - bisect.bisect_left(idle, r_k)
                if distributed_allowed(requirements, r_k, high, largest):
                    total += bisect.bisect_right(neg, -r_k)
        return total
