"""Whole-GPU, rigid requests placed as the schedulers that take a job's
request as given place them (the Slurm-style and Tiresias baselines,
docs/baselines.md).

A job asks for one GPU count (the median of its requirement set, the rule
Hops §4.2 gives the rigid baselines: :func:`rigid_requirement`) and runs on
one GPU type, any type its model runs on: a site partitions its nodes by GPU
type and a job submitted to several partitions starts in one of them.
Within a type the placement is consolidated: the one server that fits most
tightly, else the fewest servers (:func:`~.gavel.rounds.pack`). Among types
the best fit wins, as ``select/cons_tres`` picks among every node a job may
use: the fewest servers, then the fewest GPUs left free on the one server,
then the cluster's type order; the speed of a type is never consulted.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from scheduling.policies.gavel.lp import rigid_requirement, type_throughput
from scheduling.policies.gavel.rounds import pack
from scheduling.profiling import PROFILE_PREEMPT, PROFILE_SHARE
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate, config_throughput
from shared.ids import GpuType, JobId, ServerId
from shared.job import R_NUM
from shared.reuse import BASELINE_PROFILE_REUSE
from shared.snapshot import JobState, Snapshot

__all__ = ["Avail", "Known", "RigidSettings", "fits", "give", "place", "plannable",
           "rigid_requirement", "runnable_types", "take", "type_curves"]

Avail = dict[ServerId, int]  # free GPUs per server


class RigidSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The settings every rigid baseline takes besides its own: R_num for
    jobs given as bounds (§2.2), and the profiling-first layer's knobs
    (layers/profiling_first.py), the same for every policy, which the
    policy itself does not read."""

    r_num: int = R_NUM
    profile_gpus: int = 1
    profile_share: float = PROFILE_SHARE  # of each GPU type, at once (profiling.py)
    profile_preempt: bool = PROFILE_PREEMPT  # at round boundaries (profiling.py)
    # Jobs of one profile signature share profiles (shared.reuse): not
    # these baselines', whose papers know no such thing.
    profile_reuse: bool = BASELINE_PROFILE_REUSE


def type_curves(est: JobEstimate) -> JobEstimate:
    """The estimate without its per-server curves: these baselines know a
    GPU type, not a server's own speed."""
    return JobEstimate(job_id=est.job_id, by_type=est.by_type)


def runnable_types(cluster: Cluster, est: JobEstimate, gpus: int) -> tuple[GpuType, ...]:
    """The types, in cluster order, with ``gpus`` GPUs in all on which the
    job's model runs (a partition the user would submit it to)."""
    return tuple(
        t.name for t in cluster.gpu_types
        if cluster.type_gpus(t.name) >= gpus and type_throughput(est, cluster, t.name, gpus) > 0
    )


def place(
    cluster: Cluster,
    gpus: int,
    avail: Mapping[ServerId, int],
    types: tuple[GpuType, ...],
    est: JobEstimate,
) -> Configuration | None:
    """Consolidated ``gpus`` GPUs of one of ``types`` among ``avail``: the
    best fit over the types (module docstring); None when
    no type has room (or only a placement the job cannot run on, e.g. over
    servers without a distributed curve)."""
    best: tuple[int, int, int] | None = None
    chosen: Configuration | None = None
    for rank, t in enumerate(types):
        servers = [s.id for s in cluster.servers_of_type(t)]
        config = pack(gpus, servers, avail, cluster.server_index)
        if config is None or config_throughput(est, cluster, config) <= 0:
            continue
        # Best fit across the types, as cons_tres picks among all the nodes
        # a job may use: fewest servers, then the fewest GPUs left free on
        # a single server, then the type's place in the cluster.
        left = avail.get(config.parts[0][0], 0) - gpus if config.num_nodes == 1 else 0
        key = (config.num_nodes, left, rank)
        if best is None or key < best:
            best, chosen = key, config
    return chosen


class Known:
    """What one plan of a rigid baseline knows of each plannable job: its
    type-level estimate, its request and the types it may run on."""

    def __init__(self, snapshot: Snapshot, r_num: int) -> None:
        cluster = snapshot.cluster
        self.jobs = {j.id: j for j in snapshot.jobs if plannable(j, snapshot.estimates)}
        self.ests: dict[JobId, JobEstimate] = {
            jid: type_curves(snapshot.estimates[jid]) for jid in self.jobs}
        self.gpus = {jid: rigid_requirement(j.spec, r_num) for jid, j in self.jobs.items()}
        self.types: dict[JobId, tuple[GpuType, ...]] = {
            jid: runnable_types(cluster, self.ests[jid], self.gpus[jid]) for jid in self.jobs}


def fits(config: Configuration, avail: Mapping[ServerId, int]) -> bool:
    """Whether every part of ``config`` is free in ``avail``."""
    return all(avail.get(s, 0) >= g for s, g in config.parts)


def take(avail: Avail, config: Configuration) -> None:
    """Book ``config`` in ``avail`` (in place)."""
    for s, g in config.parts:
        avail[s] = avail.get(s, 0) - g


def give(avail: Avail, config: Configuration) -> None:
    """Release ``config`` into ``avail`` (in place)."""
    for s, g in config.parts:
        avail[s] = avail.get(s, 0) + g


def plannable(job: JobState, estimates: Mapping[JobId, JobEstimate]) -> bool:
    """Queued or running, with an estimate: a job these baselines plan."""
    return job.phase in ("queued", "running") and job.id in estimates
