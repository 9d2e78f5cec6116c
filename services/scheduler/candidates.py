"""Configuration generation (Hops §3.4 and §3.6 "Configuration generation").

:func:`generate_configs` is the paper's rule, literally: location-specific
configurations ``{server: gpus}`` per GPU type, aggregated on one server or,
for jobs that tolerate it, distributed over adjacent servers, so a job has
O(N_type) configurations per requirement.

The rest of the module describes the same space up to symmetry, for the class
formulation of the ILP in :mod:`services.scheduler.passes`: servers that are
interchangeable for every job of a pass form a :class:`ServerClass`, a job's
options are listed per class (:func:`class_options`), a class's servers are
packed with :func:`maximal_patterns`, and :func:`realise_patterns` maps a class
solution back onto concrete servers.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Mapping, Sequence

import msgspec

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve, sensitivity
from shared.ids import GpuType, ServerId

DEFAULT_SIGMA = 1.4
# An item packed into a server: (GPUs, tail). ``tail`` marks the partly used
# last node of a distributed option; §3.6 fills every other node of it whole.
Item = tuple[int, bool]
Pattern = tuple[Item, ...]


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
            parts = [*servers[start:last], (servers[last][0], r_k - prefix[last] + prefix[start])]
            # Distinct servers, so sorting the pairs sorts by server id.
            yield Configuration(tuple(sorted(parts))), last - start + 1


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
                        out.append(Candidate(Configuration(((sid, r_k),)), tput, spec.name))
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


class ServerClass(msgspec.Struct, frozen=True):
    """Interchangeable servers: one GPU type, the same idle GPUs, and the same
    curve for every job of the pass."""

    gpu_type: GpuType
    free: int
    servers: tuple[ServerId, ...]


class ClassOption(msgspec.Struct, frozen=True):
    """A job's option in one class: ``full`` whole servers plus one server
    with ``part`` GPUs (an aggregated option is ``full=0, part=R_k``)."""

    klass: int
    gpus: int
    throughput: float
    full: int = 0
    part: int = 0

    @property
    def nodes(self) -> int:
        return self.full + (1 if self.part else 0)

    @property
    def distributed(self) -> bool:
        return self.nodes >= 2

    def items(self, capacity: int) -> Pattern:
        """Items the option packs into its class's servers."""
        whole: Pattern = ((capacity, False),) * self.full
        return whole + (((self.part, self.distributed),) if self.part else ())


def server_classes(
    cluster: Cluster, free: Mapping[ServerId, int], estimates: Sequence[JobEstimate]
) -> tuple[ServerClass, ...]:
    """Group servers with idle GPUs by (type, S_t, every job's curve there),
    classes ordered by their first server in cluster order."""
    deviations: dict[ServerId, list[tuple[int, ThroughputCurve]]] = defaultdict(list)
    for j, est in enumerate(estimates):
        for sid in sorted(est.by_server):
            server = cluster.by_id.get(sid)
            if server is None or free.get(sid, 0) <= 0:
                continue
            curve = est.by_server[sid]
            if curve != est.by_type.get(server.gpu_type):
                deviations[sid].append((j, curve))
    groups: dict[object, list[ServerId]] = {}
    kinds: dict[object, tuple[GpuType, int]] = {}
    for s in cluster.servers:
        idle = free.get(s.id, 0)
        if idle <= 0:
            continue
        key = (s.gpu_type, idle, tuple(deviations.get(s.id, ())))
        groups.setdefault(key, []).append(s.id)
        kinds[key] = (s.gpu_type, idle)
    return tuple(ServerClass(kinds[k][0], kinds[k][1], tuple(ids)) for k, ids in groups.items())


def _class_option(
    c: int, klass: ServerClass, curve: ThroughputCurve, r_k: int, dist_ok: bool
) -> ClassOption | None:
    # Every server of a class has the same curve, so the §3.5 minimum over the
    # nodes is that one curve's value.
    if r_k <= klass.free:
        tput = curve.agg_per_gpu(r_k) * r_k
        return ClassOption(c, r_k, tput, 0, r_k) if tput > 0 else None
    if not dist_ok:
        return None
    full, part = divmod(r_k, klass.free)
    nodes = full + (1 if part else 0)
    if nodes > len(klass.servers):
        return None
    tput = curve.dist_per_gpu(nodes) * r_k
    return ClassOption(c, r_k, tput, full, part) if tput > 0 else None


def class_options(
    cluster: Cluster,
    classes: Sequence[ServerClass],
    requirements: Sequence[int],
    rho: Mapping[GpuType, float],
    est: JobEstimate,
    sigma: float = DEFAULT_SIGMA,
    largest: Mapping[GpuType, int] | None = None,
) -> list[ClassOption]:
    """One job's options per class: aggregated R_k <= S, or (when
    :func:`distributed_allowed`) R_k > S over ceil(R_k / S) servers of the
    class, filled as in §3.6 (whole servers, the last one partly)."""
    largest = largest if largest is not None else largest_servers(cluster)
    out: list[ClassOption] = []
    reqs = sorted(set(requirements))
    high_of: dict[GpuType, bool] = {}  # per type, as classes share types
    for c, klass in enumerate(classes):
        curve = job_curve(est, klass.servers[0], klass.gpu_type)
        if curve is None:
            continue
        high = high_of.get(klass.gpu_type)
        if high is None:
            high = high_of[klass.gpu_type] = is_high_sensitivity(rho, est, klass.gpu_type, sigma)
        for r_k in reqs:
            dist_ok = distributed_allowed(requirements, r_k, high, largest[klass.gpu_type])
            option = _class_option(c, klass, curve, r_k, dist_ok)
            if option is not None:
                out.append(option)
    return out


def _fits(item: Item, room: int, has_tail: bool) -> bool:
    return item[0] <= room and not (item[1] and has_tail)


def maximal_patterns(capacity: int, items: Sequence[Item], limit: int) -> list[Pattern] | None:
    """All maximal multisets of ``items`` with total GPUs <= capacity and at
    most one tail (Gilmore–Gomory cutting patterns), largest items first;
    ``None`` past ``limit``.

    One tail per server mirrors §3.6's fill: a distributed configuration takes
    whole nodes and ends on one partly used node, so two of them cannot both
    end on the same server (the later one would start there, taking it whole).
    """
    kinds = sorted({i for i in items if 0 < i[0] <= capacity}, reverse=True)
    if not kinds:
        return []
    out: list[Pattern] = []
    budget = [limit * 20]

    def walk(k: int, room: int, acc: Pattern) -> bool:
        budget[0] -= 1
        if budget[0] < 0 or len(out) > limit:
            return False
        if k == len(kinds):
            has_tail = any(tail for _, tail in acc)
            if not any(_fits(i, room, has_tail) for i in kinds):
                out.append(acc)
            return True
        size, tail = kinds[k]
        most = min(room // size, 0 if tail and any(t for _, t in acc) else 1 if tail else room)
        return all(walk(k + 1, room - n * size, acc + (kinds[k],) * n) for n in range(most, -1, -1))

    return out if walk(0, capacity, ()) and len(out) <= limit else None


def complete_pattern(held: Sequence[Item], capacity: int, items: Sequence[Item]) -> Pattern:
    """Extend a server's items to a maximal pattern over ``items`` (adding the
    largest item that still fits), so a packing maps onto pattern counts."""
    acc = sorted(held, reverse=True)
    room = capacity - sum(size for size, _ in acc)
    for item in sorted(set(items), reverse=True):
        while _fits(item, room, any(t for _, t in acc)):
            acc.append(item)
            room -= item[0]
    return tuple(sorted(acc, reverse=True))


def _take_slots(slots: Mapping[Item, deque[int]], items: Pattern) -> list[tuple[int, int]] | None:
    need = Counter(items)
    if any(len(slots.get(item, ())) < n for item, n in need.items()):
        return None
    return [(slots[item].popleft(), item[0]) for item in items]


def realise_patterns(
    klass: ServerClass,
    patterns: Sequence[Pattern],
    counts: Sequence[int],
    demands: Sequence[ClassOption],
) -> list[Configuration | None]:
    """Place chosen options of one class onto its servers.

    Pattern instances take the class's servers in cluster order. Distributed
    options are laid out first, each on consecutive servers: its whole nodes,
    then its tail, which no other option's tail shares. Feasible by
    construction when the pattern counts cover every item (the linking rows);
    a demand that is not covered gets ``None``.
    """
    instances = [p for p, n in zip(patterns, counts, strict=True) for _ in range(n)]
    instances = instances[: len(klass.servers)]
    slots: dict[Item, deque[int]] = defaultdict(deque)
    for idx, pattern in enumerate(instances):
        for item in pattern:
            slots[item].append(idx)
    order = sorted(range(len(demands)), key=lambda d: not demands[d].distributed)
    taken: dict[int, list[tuple[int, int]] | None] = {
        d: _take_slots(slots, demands[d].items(klass.free)) for d in order
    }
    position: dict[int, int] = {}
    for d in order:
        for inst, _ in taken[d] or ():
            position.setdefault(inst, len(position))
    for inst in range(len(instances)):
        position.setdefault(inst, len(position))
    out: list[Configuration | None] = []
    for d in range(len(demands)):
        parts = taken[d]
        out.append(
            None
            if parts is None
            else Configuration.of({klass.servers[position[i]]: g for i, g in parts})
        )
    return out


def undominated(opts: Sequence[ClassOption]) -> list[ClassOption]:
    """Drop an option when a smaller-or-equal option of the same job in the
    same class has at least its throughput: any packing that uses it still
    fits the smaller one (items are smaller, whole nodes fewer), so the
    optimum of Eq. (11) is unchanged."""
    keep: list[ClassOption] = []
    best: dict[int, float] = {}
    for o in sorted(opts, key=lambda o: (o.klass, o.gpus, -o.throughput)):
        if o.throughput > best.get(o.klass, 0.0):
            keep.append(o)
            best[o.klass] = o.throughput
    return keep
