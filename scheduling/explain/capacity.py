"""Capacity analysis: whether a job could be placed on some GPUs, and if
not, why (``Resources``, ``Fragmentation``, ``NodeDrained``, ``Cores``,
``Unschedulable``).

The shapes a job accepts are the ones configuration generation offers it
(Hops §3.6): a requirement of its set on one server of a type it has an
estimate for, or over several servers of that type when it tolerates
spreading (rho of Eq. 10 at most sigma) or when its smallest requirement
exceeds the type's largest server. :class:`scheduling.policies.hops.steady.Room`
is the same test the Hops policy uses to leave unplaceable jobs out.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduling.policies.hops.candidates import (
    DEFAULT_SIGMA,
    distributed_allowed,
    is_high_sensitivity,
)
from scheduling.policies.hops.steady import Room
from shared.estimate import JobEstimate
from shared.explain import Why
from shared.ids import GpuType, ServerId
from shared.snapshot import JobState, Snapshot

SIGMA = DEFAULT_SIGMA


class Demand:
    """What one GPU job asks for: its requirement set, the types it runs on
    and on which of them it may spread over servers."""

    def __init__(self, job: JobState, est: JobEstimate | None, types: tuple[GpuType, ...],
                 r_num: int, sigma: float = SIGMA) -> None:
        self.reqs = job.spec.requirement_set(r_num)
        self.types = tuple(t for t in types if est is None or t in est.by_type)
        self.est, self.sigma = est, sigma
        self._high: dict[GpuType, bool] = {}

    def high(self, t: GpuType) -> bool:
        """Whether the job must not spread over servers of ``t`` (Eq. 10);
        computed when first asked, since most jobs fit on one server."""
        if t not in self._high:
            est = self.est
            self._high[t] = est is not None and is_high_sensitivity({}, est, t, self.sigma)
        return self._high[t]

    def fits(self, room: Room) -> bool:
        """Whether some requirement fits ``room`` in a shape the job accepts."""
        for t in self.types:
            most, total, largest = room.most.get(t, 0), room.total.get(t, 0), \
                room.largest.get(t, 0)
            for r in self.reqs:
                if r <= most:
                    return True
                if r <= total and distributed_allowed(self.reqs, r, self.high(t), largest):
                    return True
        return False

    def short(self, room: Room) -> Why:
        """Why nothing fits ``room``: ``Fragmentation`` when some type has
        the smallest requirement free in total, else ``Resources`` naming
        the type closest to it and the GPUs it lacks."""
        r1 = min(self.reqs)
        totals = sorted(((room.total.get(t, 0), t) for t in self.types), reverse=True)
        free, best = totals[0]
        if free >= r1:
            return Why(code="Fragmentation", free=free, gpu_type=best,
                       message=f"{free} {best} GPUs are free in total, but in no shape "
                               f"it accepts (it needs {r1} or more)")
        return Why(code="Resources", gpu_type=best, short=r1 - free,
                   message=f"it needs at least {r1} GPUs of one type; {best} has {free} "
                           f"free, {r1 - free} short")


def before(demand: Demand, free: Room, drained: Room | None) -> Why | None:
    """The job's capacity reason on the GPUs free before the plan (None: it
    fits them). ``drained``: the same GPUs with the drained servers free."""
    if not demand.types:
        return Why(code="Unschedulable",
                   message="no server of the cluster has a GPU type it runs on")
    if demand.fits(free):
        return None
    if drained is not None and demand.fits(drained):
        return Why(code="NodeDrained", message="it fits only if drained nodes were back")
    return demand.short(free)


def cores_short(job: JobState, free_cores: Mapping[ServerId, int]) -> Why | None:
    """A CPU job's ``Cores`` reason when no server has its cores free."""
    most = max(free_cores.values(), default=0)
    if job.spec.cores <= most:
        return None
    return Why(code="Cores", short=job.spec.cores - most,
               message=f"it needs {job.spec.cores} cores on one server; the most free "
                       f"is {most}")


def free_cores(snapshot: Snapshot) -> dict[ServerId, int]:
    return {s: r.cores for s, r in snapshot.free_resources().items()}
