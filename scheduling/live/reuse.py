"""Profiles reused in the live scheduler (:mod:`shared.reuse`): which GPU
types a job still being profiled takes from its profile signature's shared
profiles instead of being profiled there.

The estimators hold the shared profiles (they follow every profile report)
and answer, with each estimate request, the types each requested job's
signature holds a current profile of (``EstimateReply.shared``). The leader
decides with the simulator's rule (:func:`shared.reuse.must_profile`), and
only where its policy reuses profiles (``profile_reuse``): the snapshot asks
no profiling run for those types, and a ``job_profiled`` naming them
records them in the job's ``profiled`` list, so the job is queued as if it
had been profiled there (:func:`scheduling.live.state.promote`).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from scheduling.live.state import PROFILING_PHASES, LiveJobRecord
from shared.cluster import Cluster
from shared.ids import GpuType, JobId
from shared.reuse import must_profile


def reused_types(rec: LiveJobRecord, shared: Set[GpuType], cluster: Cluster) -> frozenset[GpuType]:
    """The alive types a job still being profiled takes from its signature's
    shared profiles: those :func:`must_profile` skips that its own
    ``profiled`` list lacks (none for a CPU job, or once it is queued)."""
    if rec.spec.kind == "cpu" or rec.phase not in PROFILING_PHASES or not shared:
        return frozenset()
    alive = [t.name for t in cluster.gpu_types]
    return frozenset(alive) - must_profile(alive, shared) - set(rec.profiled)


def reuse_events(
    records: Mapping[JobId, LiveJobRecord],
    shared: Mapping[JobId, Set[GpuType]],
    cluster: Cluster,
) -> dict[JobId, tuple[GpuType, ...]]:
    """Per job that takes types from shared profiles, the cumulative
    ``profiled`` list its ``job_profiled`` names (its own and the reused)."""
    out: dict[JobId, tuple[GpuType, ...]] = {}
    for job_id, rec in records.items():
        reused = reused_types(rec, shared.get(job_id, frozenset()), cluster)
        if reused:
            out[job_id] = tuple(sorted(set(rec.profiled) | reused))
    return out
