"""The CPU side of the core layer (:mod:`.layer`): running CPU jobs kept,
throttled by the contention eliminator (CODA §V-D) or stopped to give
reserved cores back (§V-C), and waiting ones placed best fit. A mixin of
the layer's round, which holds the books."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from scheduling.cores.allocator import Climb
from scheduling.cores.eliminator import CpuJobLoad, GpuJobLoad, ServerLoad, eliminate
from scheduling.cores.pool import best_fit, youngest_first
from scheduling.cores.settings import CodaSettings
from scheduling.explain.records import cores_why
from shared.configuration import Configuration
from shared.explain import Why
from shared.ids import JobId, ServerId
from shared.snapshot import Assignment, JobState, Snapshot


class Layer(Protocol):
    """What the CPU side reads of :class:`~scheduling.cores.layer.CoreLayer`:
    CODA's settings (None for a baseline). Named by its shape so that the
    layer can build on this module without the two importing each other."""

    @property
    def coda(self) -> CodaSettings | None: ...


class CpuSide:
    """CPU jobs on the books of one round of the core layer."""

    layer: Layer
    snap: Snapshot
    first: bool
    cpu: list[JobState]
    gpu: list[JobState]
    servers: list[ServerId]
    total: dict[ServerId, int]
    reserve: dict[ServerId, int] | None
    climbs: dict[JobId, Climb]
    borrowers: dict[JobId, float]
    head: list[JobId]
    kept_cpu: dict[JobId, Configuration]
    array_cores: Counter[ServerId]
    borrowed: Counter[ServerId]
    gpu_cores: Counter[ServerId]
    notes: list[str]

    def cpu_room(self, s: ServerId) -> int:
        raise NotImplementedError

    def borrowable(self, s: ServerId) -> int:
        raise NotImplementedError

    def _keep_cpu(self) -> None:
        """Running CPU jobs keep their cores (a CPU job is only stopped to
        give reserved cores back, :meth:`_reclaim`), less what the
        contention eliminator takes (:mod:`.eliminator`)."""
        throttle = self._eliminate()
        for j in self.cpu:
            if j.phase == "running" and j.current is not None:
                kept = self.kept_cpu[j.id] = throttle.get(j.id, j.current)
                books = self.borrowed if j.id in self.borrowers else self.array_cores
                for s in kept.servers:
                    books[s] += kept.cores_on(s)
        self.borrowers = {j: t for j, t in self.borrowers.items() if j in self.kept_cpu}

    def _eliminate(self) -> dict[JobId, Configuration]:
        """CODA's contention eliminator (§V-D) on every server whose memory
        bandwidth is measured: the CPU jobs' new configurations, capped by
        MBA on servers that have it (``Server.mba``), else with their cores
        halved. A lift gives a job its cores back where they are free, and
        lifts its cap."""
        coda = self.layer.coda
        if coda is None or not coda.eliminate or not self.snap.bandwidth_gbps:
            return {}
        out: dict[JobId, Configuration] = {}
        for server in self.snap.cluster.servers:
            load = self._load(server.id, server.memory_bandwidth_gbps, server.mba)
            spare = self._spare(server.id)
            for act in eliminate(load) if load is not None else ():
                job = next(j for j in self.cpu if j.id == act.job)
                assert job.current is not None
                more = act.cores - job.current.total_cores
                if more > spare:
                    continue
                spare -= more  # a halving frees cores a later lift may use
                out[act.job] = Configuration.cpu(server.id, act.cores, act.mba_percent)
                self.notes.append(f"{act.kind} {act.job} to {act.cores} cores, "
                                  f"MBA {act.mba_percent}%")
        return out

    def _load(self, server: ServerId, capacity: float, mba: bool) -> ServerLoad | None:
        used = self.snap.bandwidth_gbps.get(server)
        if used is None or capacity <= 0:
            return None
        gpu = tuple(GpuJobLoad(j.id, j.throughput, c.best_throughput)
                    for j in self.gpu if j.phase == "running" and j.current is not None
                    and server in j.current.servers and j.throughput > 0
                    and (c := self.climbs.get(j.id)) is not None and c.best_throughput > 0)
        cpu = tuple(CpuJobLoad(j.id, j.current.total_cores, j.spec.cores, j.current.mba_percent)
                    for j in self.cpu if j.phase == "running" and j.current is not None
                    and j.current.servers == (server,))
        return ServerLoad(server, capacity, used, mba, gpu, cpu)

    def _spare(self, server: ServerId) -> int:
        """Cores nobody holds on ``server`` (before this plan's changes)."""
        held = sum(j.current.cores_on(server) for j in self.snap.jobs
                   if j.phase == "running" and j.current is not None)
        return self.total.get(server, 0) - held

    def _waiting_cpu(self) -> list[JobState]:
        return [j for j in self.cpu if j.phase != "running"]

    def _reclaim(self) -> list[JobId]:
        """Stop the youngest borrowers on each server whose GPU jobs need the
        reserved cores they hold (first plans only)."""
        stopped: list[JobId] = []
        if self.reserve is None:
            return stopped
        for s in self.servers:
            # Over the reserve, or over the server when CPU-array jobs
            # outgrew their array (the reserve grew with history).
            over = max(self.gpu_cores[s] + self.borrowed[s] - self.reserve[s],
                       self.gpu_cores[s] + self.array_cores[s] + self.borrowed[s]
                       - self.total.get(s, 0))
            on = [j for j, c in self.kept_cpu.items() if j in self.borrowers and s in c.servers]
            for job in youngest_first(self.borrowers, on):
                if over <= 0:
                    break
                cores = self.kept_cpu.pop(job).cores_on(s)
                self.borrowed[s] -= cores
                over -= cores
                del self.borrowers[job]
                stopped.append(job)
        self.head = [*stopped, *(j for j in self.head if j not in stopped)]
        return stopped

    def _place_cpu(self, jobs: Sequence[JobState]) -> list[Assignment]:
        """Best-fit placement of waiting CPU jobs in order; requeued
        borrowers first, and one past the wait bound before all and, while
        it does not fit, blocking the CPU array."""
        out: list[Assignment] = []
        bound = self.layer.coda.cpu_wait_bound_s if self.layer.coda else math.inf
        first = {j: i for i, j in enumerate(self.head)}
        queue = sorted(jobs, key=lambda j: (j.wait_s < bound, first.get(j.id, len(first))))
        for job in queue:
            cores = job.spec.cores
            rooms = {s: self.cpu_room(s) for s in self.servers}
            where, borrowed = best_fit(rooms, cores, self.servers), 0
            if where is None and self.reserve is not None:
                spare = {s: rooms[s] + self.borrowable(s) for s in self.servers}
                where = best_fit(spare, cores, self.servers)
                borrowed = 0 if where is None else max(0, cores - rooms[where])
            if where is None:
                if job.wait_s >= bound:
                    self.notes.append(f"CPU job {job.id} past the wait bound blocks the array")
                    break
                continue
            self.array_cores[where] += cores - borrowed
            self.borrowed[where] += borrowed
            if borrowed:
                self.borrowers[job.id] = self.snap.now
            self.head = [j for j in self.head if j != job.id]
            out.append(Assignment(job.id, Configuration.cpu(where, cores)))
        return out

    def cpu_whys(self, name: str, placed: set[JobId],
                 stopped: Sequence[JobId]) -> dict[JobId, Why]:
        """The layer's ``Cores`` reason for each CPU job it did not place:
        the cores it lacks on the server with the most it could take, or,
        with cores enough, the CPU job past the wait bound that holds the
        array (its short is then 0); a borrower stopped at this plan has
        had its cores reclaimed for GPU jobs (§V-C)."""
        out: dict[JobId, Why] = {}
        gone = set(stopped)
        most = max((self.cpu_room(s) + self.borrowable(s) for s in self.servers), default=0)
        for job in self.cpu:
            if job.id in placed:
                continue
            if job.id in gone:
                out[job.id] = cores_why(name, "its borrowed cores went back to GPU jobs")
            elif job.phase != "running":
                short = max(0, job.spec.cores - most)
                out[job.id] = cores_why(
                    name, f"it needs {job.spec.cores} cores on one server; the most free is "
                          f"{most}" if short else "the cores are kept for a CPU job that has "
                                                  "waited longer", short)
        return out
