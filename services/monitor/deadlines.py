"""Heartbeat deadlines (pure; the caller passes the time).

The monitor (§3.1: it "continuously checks if a job has failed or ended")
watches two kinds of heartbeats:

* every registered, alive node beats, listing the jobs it runs; a node
  silent for longer than ``timeout`` is **lost** (with every job part on it);
* every part of a placement (a job on one server, from ``hops_alloc``)
  beats through its job process. A part silent for longer than ``timeout``
  is judged only once its node has beaten past that part's deadline (when a
  whole node dies, its jobs fall silent a little before the node itself is
  overdue, and the node is to blame, not the job). Then, if the node still
  lists the job, its process hangs: the job is **lost**. If the node no
  longer lists it, the process ended, and the event saying how (a profile
  report, ``job_finished``, ``job_failed``) is on its way; only when no such
  event released the part within ``vanish_grace`` is the part **vanished**.

Two more findings: a placement part on a server that is not watched (never
registered, or already lost) is **stranded** once it is older than
``timeout``; and a job a node reports running without a placement there
for longer than ``orphan_grace`` is an **orphan**, reported again every
``orphan_grace`` while it stays (the caller stops it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from shared.ids import JobId, ServerId

Part = tuple[JobId, ServerId]
Verdict = Literal["lost", "stranded", "vanished"]


@dataclass(frozen=True)
class Expired:
    """What one :meth:`DeadlineTracker.check` found."""

    nodes: tuple[tuple[ServerId, float], ...] = ()  # (server, last heartbeat)
    jobs: tuple[Part, ...] = ()  # the first silent part of each lost job
    stranded: tuple[Part, ...] = ()
    orphans: tuple[Part, ...] = ()
    vanished: tuple[Part, ...] = ()
    progress: dict[JobId, float] = field(default_factory=dict)  # of the jobs above

    def __bool__(self) -> bool:
        return bool(self.nodes or self.jobs or self.stranded or self.orphans or self.vanished)


@dataclass
class DeadlineTracker:
    timeout: float
    orphan_grace: float = 0.0  # 0: twice the timeout
    vanish_grace: float = 0.0  # 0: ten times the timeout
    start_grace: float = 0.0  # 0: ten times the timeout
    _nodes: dict[ServerId, float] = field(default_factory=dict)
    _listed: dict[ServerId, frozenset[JobId]] = field(default_factory=dict)
    _parts: dict[JobId, dict[ServerId, float]] = field(default_factory=dict)
    _progress: dict[JobId, float] = field(default_factory=dict)
    _orphans: dict[Part, float] = field(default_factory=dict)
    _heard: set[Part] = field(default_factory=set)  # parts with a heartbeat
    _first_listed: dict[Part, float] = field(default_factory=dict)  # parts not heard

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        if self.orphan_grace <= 0:
            self.orphan_grace = 2 * self.timeout
        if self.vanish_grace <= 0:
            self.vanish_grace = 10 * self.timeout
        if self.start_grace <= 0:
            self.start_grace = 10 * self.timeout

    # --- nodes ------------------------------------------------------------------------

    def watch_node(self, server: ServerId, now: float) -> None:
        """Start (or restart) the deadline of an alive node."""
        self._nodes[server] = now

    def forget_node(self, server: ServerId) -> None:
        """The node was removed: no deadline, no orphans on it."""
        self._nodes.pop(server, None)
        self._listed.pop(server, None)
        for part in [p for p in self._orphans if p[1] == server]:
            del self._orphans[part]

    def watching(self, server: ServerId) -> bool:
        return server in self._nodes

    def node_beat(self, server: ServerId, now: float, running: Iterable[JobId] = ()) -> bool:
        """Record a node heartbeat; False (and nothing recorded) for a node
        not watched, which the caller must register or revive first."""
        if server not in self._nodes:
            return False
        self._nodes[server] = max(self._nodes[server], now)
        listed = frozenset(running)
        self._listed[server] = listed
        for job in listed:
            if server in self._parts.get(job, {}):
                self._orphans.pop((job, server), None)
                if (job, server) not in self._heard:
                    self._first_listed.setdefault((job, server), now)
            else:
                self._orphans.setdefault((job, server), now)
        for part in [p for p in self._orphans if p[1] == server and p[0] not in listed]:
            del self._orphans[part]
        return True

    # --- placements -----------------------------------------------------------------

    def expect(self, job: JobId, servers: Iterable[ServerId], now: float) -> None:
        """The job holds ``servers`` now (a placement was written); parts
        already watched keep their deadline."""
        old = self._parts.get(job, {})
        self._parts[job] = {s: old.get(s, now) for s in servers}
        for s in self._parts[job]:
            self._orphans.pop((job, s), None)
            # A new placement may mean a new process (profiling, then running):
            # a process that runs on beats again within its interval.
            self._heard.discard((job, s))
            self._first_listed.pop((job, s), None)

    def release(self, job: JobId) -> None:
        """The job holds nothing any more."""
        for s in self._parts.pop(job, {}):
            self._heard.discard((job, s))
            self._first_listed.pop((job, s), None)
        self._progress.pop(job, None)

    def expected(self, job: JobId) -> tuple[ServerId, ...]:
        return tuple(sorted(self._parts.get(job, {})))

    def job_beat(self, job: JobId, server: ServerId, now: float, samples_done: float) -> bool:
        """Record a job heartbeat; False if that part is not expected."""
        parts = self._parts.get(job)
        if parts is None or server not in parts:
            return False
        parts[server] = max(parts[server], now)
        self._heard.add((job, server))
        self._first_listed.pop((job, server), None)
        self._progress[job] = max(self._progress.get(job, 0.0), samples_done)
        return True

    def progress(self, job: JobId) -> float | None:
        """The largest ``samples_done`` the job's heartbeats reported."""
        return self._progress.get(job)

    def rebase(self, now: float) -> None:
        """Every deadline starts again at ``now``: the monitor itself could not
        hear anyone for a while (its NATS connection was down), which says
        nothing about the nodes."""
        for s in self._nodes:
            self._nodes[s] = max(self._nodes[s], now)
        for parts in self._parts.values():
            for s in parts:
                parts[s] = max(parts[s], now)

    # --- the check ------------------------------------------------------------------

    def check(self, now: float) -> Expired:
        """Everything overdue at ``now``; each finding is reported once (a
        lost node is no longer watched, a lost job no longer expected)."""
        nodes = tuple(sorted((s, t) for s, t in self._nodes.items() if now - t > self.timeout))
        for s, _ in nodes:
            del self._nodes[s]
            self._listed.pop(s, None)
            for part in [p for p in self._orphans if p[1] == s]:
                del self._orphans[part]
        lost_now = {s for s, _ in nodes}
        found: dict[Verdict, list[Part]] = {"lost": [], "stranded": [], "vanished": []}
        for job, parts in sorted(self._parts.items()):
            if lost_now & parts.keys():
                continue  # the caller releases the jobs of a lost node
            for s, t in sorted(parts.items()):
                verdict = self._judge(job, s, t, now)
                if verdict is not None:
                    found[verdict].append((job, s))
                    break
        progress: dict[JobId, float] = {}
        for parts_found in found.values():
            for job, _ in parts_found:
                if job in self._progress:
                    progress[job] = self._progress[job]
                self.release(job)
        orphans = tuple(sorted(p for p, t in self._orphans.items() if now - t > self.orphan_grace))
        for part in orphans:
            self._orphans[part] = now
        return Expired(nodes, tuple(found["lost"]), tuple(found["stranded"]), orphans,
                       tuple(found["vanished"]), progress)

    def _judge(self, job: JobId, server: ServerId, last: float, now: float) -> Verdict | None:
        """What a part silent since ``last`` is at ``now`` (None: nothing yet)."""
        if now - last <= self.timeout:
            return None
        node_seen = self._nodes.get(server)
        if node_seen is None:
            return "stranded"
        if node_seen - last <= self.timeout:
            return None  # the node has not spoken since: wait for its verdict
        if job in self._listed.get(server, frozenset()):
            listed_at = self._first_listed.get((job, server))
            if listed_at is not None and now - listed_at <= self.start_grace:
                return None  # still starting: its executor judges the start
            return "lost"
        return "vanished" if now - last > self.vanish_grace else None
