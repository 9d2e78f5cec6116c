"""Two guards around a Hops plan where the paper is silent (§3.6).

- **Unplaceable jobs hold nothing back.** A waiting job that no
  configuration on this call's free GPUs could serve (its smallest
  requirement exceeds every server of a type, and it may not spread over
  servers, or exceeds the type altogether) is left out of the call: it would
  otherwise fill the service window, and the ILP over that window assigns
  nothing. It counts neither in the window nor in the fair shares (the age
  of Eq. 9) of the others, so adding it changes nothing of their plan.
- **Running jobs stay put.** Configurations on interchangeable servers are
  equally good, and a solver stopped within its gap may hand a running job
  the twin of its current one: a checkpoint-restart for nothing. After the
  passes, a running job moved to a configuration no faster than its current
  one goes back to its current one wherever those GPUs are still free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec

from scheduling.policies.hops.candidates import (
    distributed_allowed,
    is_high_sensitivity,
    largest_servers,
)
from shared.cluster import Cluster
from shared.estimate import JobEstimate, config_throughput
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import Assignment, JobState, Snapshot

# Relative slack under which two throughputs count as equal: estimates of
# twin servers differ only by float noise.
SAME = 1e-9


class Room:
    """Free GPUs per type: the most on one server and the total."""

    def __init__(self, cluster: Cluster, free: Mapping[ServerId, int]) -> None:
        self.largest = largest_servers(cluster)
        self.most: dict[GpuType, int] = {}
        self.total: dict[GpuType, int] = {}
        for s in cluster.servers:
            g = free.get(s.id, 0)
            self.most[s.gpu_type] = max(self.most.get(s.gpu_type, 0), g)
            self.total[s.gpu_type] = self.total.get(s.gpu_type, 0) + g

    def admits(self, reqs: Sequence[int], est: JobEstimate, sigma: float) -> bool:
        """Whether configuration generation (§3.6) could give the job anything here."""
        for t in est.by_type:
            high = is_high_sensitivity({}, est, t, sigma)
            for r in reqs:
                if r <= self.most.get(t, 0):
                    return True
                spread = distributed_allowed(reqs, r, high, self.largest.get(t, 0))
                if spread and r <= self.total.get(t, 0):
                    return True
        return False


def unplaceable(
    snapshot: Snapshot, free: Mapping[ServerId, int], r_num: int, sigma: float
) -> tuple[JobId, ...]:
    """Waiting jobs with an estimate that nothing on ``free`` could serve."""
    room = Room(snapshot.cluster, free)
    return tuple(
        j.id
        for j in snapshot.jobs
        if j.phase == "queued"
        and j.id in snapshot.estimates
        and not room.admits(j.spec.requirement_set(r_num), snapshot.estimates[j.id], sigma)
    )


def without(snapshot: Snapshot, left_out: Sequence[JobId]) -> Snapshot:
    """``snapshot`` without the jobs ``left_out``."""
    if not left_out:
        return snapshot
    gone = set(left_out)
    return msgspec.structs.replace(
        snapshot,
        jobs=tuple(j for j in snapshot.jobs if j.id not in gone),
        estimates={k: v for k, v in snapshot.estimates.items() if k not in gone},
    )


def keep_in_place(
    assignments: Sequence[Assignment],
    jobs: Mapping[JobId, JobState],
    estimates: Mapping[JobId, JobEstimate],
    cluster: Cluster,
    free: Mapping[ServerId, int],
) -> list[Assignment]:
    """``assignments`` with every running job moved for no gain put back
    where it runs, if its GPUs there are still free (see the module docstring)."""
    used: Counter[ServerId] = Counter()
    for a in assignments:
        used.update(a.config.as_dict())
    out = list(assignments)
    for i, a in enumerate(out):
        job = jobs.get(a.job_id)
        current = job.current if job is not None and job.phase == "running" else None
        if current is None or current == a.config or a.job_id not in estimates:
            continue
        if any(s not in cluster.by_id for s in current.servers):
            continue  # on a server that left
        est = estimates[a.job_id]
        there = config_throughput(est, cluster, current)
        if there < config_throughput(est, cluster, a.config) * (1.0 - SAME):
            continue  # the move is worth something
        used.subtract(a.config.as_dict())
        if all(used[s] + g <= free.get(s, 0) for s, g in current.parts):
            out[i] = msgspec.structs.replace(a, config=current, throughput=there)
            used.update(current.as_dict())
        else:
            used.update(a.config.as_dict())
    return out
