"""How the monitor releases resources (pure): §3.1's "releasing the occupied
resources immediately upon failure or end".

Every release deletes the job's ``hops_alloc`` entry and publishes
``resources_released`` so the scheduler can plan the freed GPUs within the
round (§3.6). Before that, the job's processes on the servers still alive
get a ``stop_job``: a job that ended on its lead server still has workers
on the others, and a GPU is only free once nothing runs on it. What else
is published depends on why:

==================  ============================  =====================================
cause               job event                     stops sent to
==================  ============================  =====================================
job finished,       none (already published)      every server of the placement
failed, cancelled
heartbeat lost      ``job_failed``                every server of the placement
(its node still     ("heartbeat lost"), unless
lists it: it hangs) the job already ended; when
                    no stop found the process,
                    ``job_stopped`` (requeued)
node lost           ``job_stopped`` ("node        the placement's other servers
                    lost"): back to the queue
node removed        ``job_stopped`` ("node        every server of the placement (the
(by an operator)    removed"): back to the queue  removed node's executor may still run)
profile reported    none                          the profiled server (its part only)
process vanished    ``job_stopped``, for a run    every server of a run; a profiling
(ended, no event;   (a profiling run: none)       run's server (its part only)
or lost by a
restarted executor)
==================  ============================  =====================================

A profiling placement that loses its node publishes no ``job_stopped``
(the job was not running); the released resources tell the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import msgspec

from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.records import Placement

JobEventKind = Literal["none", "stopped", "failed"]
NODE_LOST = "node lost"
NODE_REMOVED = "node removed"
HEARTBEAT_LOST = "heartbeat lost"
PROFILED = "profiled"
VANISHED = "process vanished"


@dataclass(frozen=True)
class Release:
    """Release ``servers`` of ``job_id``'s placement (all of it unless
    ``remaining`` is set, which then replaces the entry)."""

    job_id: JobId
    servers: tuple[ServerId, ...]
    stop_on: tuple[ServerId, ...]
    event: JobEventKind
    reason: str
    samples_done: float | None = None
    remaining: Placement | None = None


def on_job_end(placement: Placement, kind: str) -> Release:
    """The job finished, failed or was cancelled (a ``HOPS_JOBS`` event)."""
    servers = placement.configuration.servers
    return Release(placement.job_id, servers, servers, "none", kind)


def on_heartbeat_lost(placement: Placement, ended: bool,
                      samples_done: float | None = None) -> Release:
    """A part of the job fell silent while its node beat on; ``ended``: the
    job is already final, so no second verdict is published. The verdict
    stands only once a stop found the process (:func:`confirmed`)."""
    servers = placement.configuration.servers
    return Release(placement.job_id, servers, servers, "none" if ended else "failed",
                   HEARTBEAT_LOST, samples_done)


def confirmed(rel: Release, found: bool) -> Release:
    """``rel`` once its stops were answered; ``found``: some executor was
    running the job and stopped it. A ``failed`` verdict stands only then:
    the process hung. Otherwise it had ended, or was being stopped by the
    placer (an executor answers the monitor's stop after the placer's), or
    no executor answered: nothing shows that the job's own process failed,
    so it goes back to the queue with its progress."""
    if rel.event != "failed" or found:
        return rel
    return replace(rel, event="stopped")


def on_node_lost(server: ServerId, placement: Placement, samples_done: float | None = None,
                 ended: bool = False) -> Release | None:
    """``server`` is gone with the job's processes on it, so the job waits
    again (``ended``: it is final already); None if the placement does not
    touch ``server``."""
    servers = placement.configuration.servers
    if server not in servers:
        return None
    others = tuple(s for s in servers if s != server)
    event: JobEventKind = "stopped" if placement.mode == "run" and not ended else "none"
    return Release(placement.job_id, servers, others, event, NODE_LOST,
                   samples_done if event == "stopped" else None)


def on_node_removed(server: ServerId, placement: Placement, samples_done: float | None = None,
                    ended: bool = False) -> Release | None:
    """An operator removed ``server``: as a lost node, but its executor may
    still run its part of the job, so that part is stopped too."""
    rel = on_node_lost(server, placement, samples_done, ended)
    if rel is None:
        return None
    return replace(rel, stop_on=placement.configuration.servers, reason=NODE_REMOVED)


def on_profiled(placement: Placement, server: ServerId) -> Release | None:
    """The profiling run of the job on ``server`` reported (§3.2): free that
    GPU; None when the placement holds no profiling run there."""
    if placement.mode != "profile":
        return None
    return _drop_part(placement, server, PROFILED)


def on_vanished(placement: Placement, server: ServerId, samples_done: float | None,
                ended: bool = False) -> Release | None:
    """The job's process on ``server`` ended, but no event said how in time:
    a profiling run frees its GPU; a run goes back to the queue."""
    if placement.mode == "profile":
        return _drop_part(placement, server, VANISHED)
    if server not in placement.configuration.servers:
        return None
    servers = placement.configuration.servers
    event: JobEventKind = "none" if ended else "stopped"
    return Release(placement.job_id, servers, servers, event, VANISHED,
                   None if ended else samples_done)


def _drop_part(placement: Placement, server: ServerId, reason: str) -> Release | None:
    if server not in placement.configuration.servers:
        return None
    rest = {s: g for s, g in placement.configuration.parts if s != server}
    remaining = None
    if rest:
        remaining = msgspec.structs.replace(
            placement,
            configuration=Configuration.of(rest),
            gpu_indices={s: i for s, i in placement.gpu_indices.items() if s != server},
        )
    return Release(placement.job_id, (server,), (server,), "none", reason, None, remaining)


@dataclass
class EarlyReports:
    """Profile reports that came before the placement of their run: the
    placer writes ``hops_alloc`` once every server acknowledged, and a short
    profiling run may have reported by then. When the placement appears, its
    parts reported already are released at once. A report no placement
    claimed within ``ttl`` seconds is forgotten."""

    ttl: float = 120.0
    _seen: dict[tuple[JobId, ServerId], float] = field(default_factory=dict)

    def add(self, job: JobId, server: ServerId, now: float) -> None:
        self._seen[(job, server)] = now

    def take(self, placement: Placement, now: float) -> tuple[ServerId, ...]:
        """The profiled parts of ``placement`` whose report came early (forgotten now)."""
        for part in [p for p, t in self._seen.items() if now - t > self.ttl]:
            del self._seen[part]
        if placement.mode != "profile":
            return ()
        found = tuple(s for s in placement.configuration.servers
                      if self._seen.pop((placement.job_id, s), None) is not None)
        return found
