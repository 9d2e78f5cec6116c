"""The configuration space of :mod:`scheduling.policies.hops.candidates` up to
symmetry, for the class formulation of the ILP in
:mod:`scheduling.policies.hops.passes`: servers that are interchangeable for every
job of a pass form a :class:`ServerClass`, a job's options are listed per
class (:func:`class_options`), a class's servers are packed with
:func:`maximal_patterns`, and :func:`realise_patterns` maps a class solution
back onto concrete servers.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Mapping, Sequence

import msgspec

from scheduling.policies.hops.candidates import (
    DEFAULT_SIGMA,
    distributed_allowed,
    is_high_sensitivity,
    job_curve,
    largest_servers,
)
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, ServerId

# An item packed into a server: (GPUs, tail). ``tail`` marks the partly used
# last node of a distributed option; §3.6 fills every other node of it whole.
Item = tuple[int, bool]
Pattern = tuple[Item, ...]


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


def keep_servers(
    servers: Sequence[ServerId],
    configs: Sequence[Configuration | None],
    wanted: Sequence[Configuration | None],
) -> list[Configuration | None]:
    """Permute a class's servers so that realised jobs land where they run now.

    The servers of a class are interchangeable for every job of the pass, so
    any permutation applied to all of the class's configurations keeps the
    packing feasible and Eq. (11) unchanged; choosing one that maps each job's
    realised servers onto its current ones (largest jobs first) spares those
    jobs a checkpoint-restart.
    """
    members = set(servers)
    perm: dict[ServerId, ServerId] = {}
    targets: set[ServerId] = set()
    order = sorted(range(len(configs)), key=lambda d: -(configs[d] or _EMPTY).total_gpus)
    for d in order:
        got, want = configs[d], wanted[d]
        if got is None or want is None or not set(want.servers) <= members:
            continue
        src = sorted(got.parts, key=lambda p: (-p[1], p[0]))
        dst = sorted(want.parts, key=lambda p: (-p[1], p[0]))
        if [g for _, g in src] != [g for _, g in dst]:
            continue
        pairs = [(a, b) for (a, _), (b, _) in zip(src, dst, strict=True)]
        if all((a not in perm and b not in targets) or perm.get(a) == b for a, b in pairs):
            for a, b in pairs:
                perm[a] = b
                targets.add(b)
    free_targets = iter(s for s in servers if s not in targets)
    for s in servers:
        if s not in perm:
            perm[s] = next(free_targets)
    return [
        None if c is None else Configuration.of({perm[sid]: g for sid, g in c.parts})
        for c in configs
    ]


def _same_shape(klass: ServerClass, opt: ClassOption, want: Configuration) -> bool:
    members = set(klass.servers)
    sizes = sorted((g for _, g in want.parts), reverse=True)
    return set(want.servers) <= members and sizes == [g for g, _ in opt.items(klass.free)]


def _first_fit(
    klass: ServerClass, opt: ClassOption, room: dict[ServerId, int], tails: set[ServerId]
) -> Configuration | None:
    """``opt`` on the first servers with room, in class order: its whole
    nodes on empty servers, its tail on a server without another tail."""
    parts: dict[ServerId, int] = {}
    whole = [s for s in klass.servers if room[s] == klass.free][: opt.full]
    if len(whole) < opt.full:
        return None
    parts.update(dict.fromkeys(whole, klass.free))
    if opt.part:
        tail = opt.distributed
        spot = next((s for s in klass.servers if s not in parts and room[s] >= opt.part
                     and not (tail and s in tails)), None)
        if spot is None:
            return None
        parts[spot] = opt.part
        if tail:
            tails.add(spot)
    for s, g in parts.items():
        room[s] -= g
    return Configuration.of(parts)


def pin_kept(
    klass: ServerClass,
    demands: Sequence[ClassOption],
    wanted: Sequence[Configuration | None],
) -> list[Configuration | None] | None:
    """Place chosen options of one class with every job whose option has its
    current shape in this class on exactly its current servers, the other
    options first-fit around them (distributed and larger first); ``None``
    when they do not all fit that way (``HopsSettings.keep_in_place_partial``).

    :func:`keep_servers` relabels one realisation, so two jobs that the
    patterns put on one server cannot both go back to theirs; here each
    kept job's GPUs are taken first (the running jobs' configurations are
    disjoint, so they fit together) and only the others are packed anew.
    """
    room = dict.fromkeys(klass.servers, klass.free)
    tails: set[ServerId] = set()
    out: list[Configuration | None] = [None] * len(demands)
    for d, (opt, want) in enumerate(zip(demands, wanted, strict=True)):
        if want is None or not _same_shape(klass, opt, want):
            continue
        if any(room[s] < g for s, g in want.parts):
            continue
        for s, g in want.parts:
            room[s] -= g
        if opt.distributed and opt.part:
            tails.add(min(want.parts, key=lambda p: (p[1], p[0]))[0])
        out[d] = want
    rest = sorted((d for d in range(len(demands)) if out[d] is None),
                  key=lambda d: (not demands[d].distributed, -demands[d].gpus, d))
    for d in rest:
        config = _first_fit(klass, demands[d], room, tails)
        if config is None:
            return None
        out[d] = config
    return out


_EMPTY = Configuration(((ServerId("-"), 1),))
