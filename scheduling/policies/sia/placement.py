"""Sia's Placer: turn type-level allocations into servers.

Sia decides, per job, only a GPU type and a GPU count (its *Allocation*
stage) and leaves the choice of servers to a separate *Placement* stage
(Jayaram Subramanya et al., SOSP'23, §3.1 "Decoupled allocation and
placement"). Its rules: (a) an allocation smaller than a node is not split
across nodes, (b) a multi-node allocation takes whole nodes, (c) when no
placement satisfies (a) and (b), evict some jobs and try again.

This module realises those rules for one round, following the artifact's
``alloc_to_placement_smart`` (``sia-simulator/sia.py`` in
``siasosp23/artifacts``) in spirit:

* a job whose allocation is unchanged keeps its current servers;
* the others are placed larger first (ties in queue order), a multi-node
  allocation on whole free nodes taken from the end of the type's server list
  and its remainder (when the count is not a multiple of the node size, which
  Sia's own configuration set never produces) best-fit on one more node, a
  single-node allocation best-fit (the fullest server that still fits it,
  ties in cluster order);
* rule (c) becomes one retry in which nobody keeps their servers and the
  whole type is packed afresh; the attempt that places more GPUs wins (the
  first on a tie, as it moves fewer jobs).

Unlike the artifact, which asserts that placement succeeds, an allocation
that still cannot be placed is dropped for the round: the type-level ILP did
not see the server-level fragmentation that defeated it, which is the
weakness Hops §4.3 measures ("discrepancies between the computed allocation
scheme and the actual placement").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.cluster import Cluster, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId


@dataclass(frozen=True, slots=True)
class TypeAllocation:
    """One job's allocation from Sia's ILP: ``gpus`` GPUs of ``gpu_type`` over
    ``nodes`` nodes. ``keep`` is the job's current configuration when the
    allocation is unchanged (same type, same count), else None. ``rank`` is
    the job's position in the priority queue (0 first)."""

    job_id: JobId
    gpu_type: GpuType
    gpus: int
    nodes: int
    rank: int
    keep: Configuration | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each placed job runs, and the allocations that found no servers."""

    configs: dict[JobId, Configuration]
    unplaced: tuple[JobId, ...]


def place(
    cluster: Cluster, free: Mapping[ServerId, int], allocations: Sequence[TypeAllocation]
) -> Placement:
    """Place every allocation on servers of its type, type by type."""
    configs: dict[JobId, Configuration] = {}
    unplaced: list[JobId] = []
    for spec in cluster.gpu_types:
        mine = [a for a in allocations if a.gpu_type == spec.name]
        if not mine:
            continue
        servers = list(cluster.servers_of_type(spec.name))
        placed, failed = _place_type(servers, free, mine)
        configs.update(placed)
        unplaced.extend(failed)
    order = {a.job_id: a.rank for a in allocations}
    return Placement(configs, tuple(sorted(unplaced, key=lambda j: order[j])))


def _place_type(
    servers: Sequence[Server], free: Mapping[ServerId, int], allocs: Sequence[TypeAllocation]
) -> tuple[dict[JobId, Configuration], list[JobId]]:
    kept = _attempt(servers, free, allocs, keep=True)
    if not kept[1] or all(a.keep is None for a in allocs):
        return kept
    # Sia's rule (c): evict the jobs that kept their servers and pack again.
    repacked = _attempt(servers, free, allocs, keep=False)
    return repacked if _placed_gpus(repacked[0]) > _placed_gpus(kept[0]) else kept


def _placed_gpus(configs: Mapping[JobId, Configuration]) -> int:
    return sum(c.total_gpus for c in configs.values())


def _attempt(
    servers: Sequence[Server],
    free: Mapping[ServerId, int],
    allocs: Sequence[TypeAllocation],
    *,
    keep: bool,
) -> tuple[dict[JobId, Configuration], list[JobId]]:
    left = {s.id: free.get(s.id, 0) for s in servers}
    placed: dict[JobId, Configuration] = {}
    rest: list[TypeAllocation] = []
    for a in allocs:
        if keep and a.keep is not None and _fits(left, a.keep):
            _take(left, a.keep)
            placed[a.job_id] = a.keep
        else:
            rest.append(a)
    per_node = max((s.gpus for s in servers), default=0)
    failed: list[JobId] = []
    for a in sorted(rest, key=lambda a: (-a.gpus, a.rank)):
        config = _fit(servers, left, a.gpus, a.nodes, per_node)
        if config is None:
            failed.append(a.job_id)
            continue
        _take(left, config)
        placed[a.job_id] = config
    return placed, failed


def _fits(left: Mapping[ServerId, int], config: Configuration) -> bool:
    return all(left.get(sid, 0) >= g for sid, g in config.parts)


def _take(left: dict[ServerId, int], config: Configuration) -> None:
    for sid, g in config.parts:
        left[sid] -= g


def _fit(
    servers: Sequence[Server], left: Mapping[ServerId, int], gpus: int, nodes: int, per_node: int
) -> Configuration | None:
    """Rules (a) and (b): one server for a single-node allocation; whole
    nodes (plus at most one partial node) for a multi-node one."""
    if nodes == 1:
        sid = _best_fit(servers, left, gpus, exclude=set())
        return None if sid is None else Configuration.of({sid: gpus})
    whole, remainder = divmod(gpus, per_node)
    # Whole nodes come from the end of the list, as in the artifact, so that
    # multi-node jobs and the best-fit single-node jobs grow from opposite ends.
    empty = [s.id for s in reversed(servers) if s.gpus == per_node and left[s.id] == per_node]
    if len(empty) < whole:
        return None
    parts = dict.fromkeys(empty[:whole], per_node)
    if remainder:
        sid = _best_fit(servers, left, remainder, exclude=set(parts))
        if sid is None:
            return None
        parts[sid] = remainder
    return Configuration.of(parts)


def _best_fit(
    servers: Sequence[Server], left: Mapping[ServerId, int], gpus: int, exclude: set[ServerId]
) -> ServerId | None:
    """The server with the fewest free GPUs that still hold ``gpus``
    (earliest in cluster order on a tie), or None."""
    fits = [
        (left[s.id], i, s.id)
        for i, s in enumerate(servers)
        if s.id not in exclude and left[s.id] >= gpus
    ]
    return min(fits)[2] if fits else None
