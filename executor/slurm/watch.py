"""One reader of Slurm for the whole bridge: every ``poll_s`` it reads the
partition's jobs and nodes (one ``squeue``/``sinfo`` or two REST calls,
whatever the number of nodes and jobs) and wakes whoever waits for the
next reading.

A reading that fails keeps the last one and is retried: Hops decides
nothing on a Slurm it cannot read. A node is dead for Hops only after it
has read dead for ``down_s`` on end (a resumed node reads not responding
for about a second, docs/slurm.md); one slurmctld has not heard from since
it restarted (UNKNOWN) keeps its last verdict, for ten debounces at most.
Each reading also cancels the Slurm jobs Hops disowned that it shows
(:mod:`executor.slurm.strays`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from structlog.typing import FilteringBoundLogger

from executor.slurm.cli import SlurmFailure
from executor.slurm.client import SlurmClient
from executor.slurm.records import SlurmJob, SlurmNode
from executor.slurm.strays import Strays
from shared.slurm_nodes import dead_since_after, node_counted_alive, undetermined_since_after


class SlurmWatch:
    """The latest reading of Slurm (see the module docstring)."""

    def __init__(self, client: SlurmClient, poll_s: float, down_s: float,
                 log: FilteringBoundLogger) -> None:
        self.client = client
        self.poll_s = poll_s
        self.down_s = down_s
        self.log = log
        self.jobs: dict[int, SlurmJob] = {}
        self.nodes: dict[str, SlurmNode] = {}
        # When the latest reading began (time.time()): a job submitted
        # after it may be missing from it without being gone.
        self.read_at = 0.0
        self._dead_since: dict[str, float] = {}
        self._undetermined_since: dict[str, float] = {}  # read UNKNOWN since
        self._fresh = asyncio.Event()
        self._failing = False
        self.strays = Strays()

    async def read(self) -> None:
        """Read Slurm once (:class:`SlurmFailure` when it cannot be read)."""
        began = time.time()
        jobs = await self.client.jobs()
        nodes = await self.client.nodes()
        self.jobs = {j.job_id: j for j in jobs}
        self.nodes = {n.name: n for n in nodes}
        self.read_at = began
        for node in nodes:
            since = dead_since_after(self._dead_since.get(node.name), node.health, began)
            if since is None:
                self._dead_since.pop(node.name, None)
            else:
                self._dead_since[node.name] = since
            unknown = undetermined_since_after(self._undetermined_since.get(node.name),
                                               node.health, began)
            if unknown is None:
                self._undetermined_since.pop(node.name, None)
            else:
                self._undetermined_since[node.name] = unknown
        fresh, self._fresh = self._fresh, asyncio.Event()
        fresh.set()
        if self.strays:
            await self._cancel_strays()

    async def _cancel_strays(self) -> None:
        for job in self.strays.due(self.jobs.values(), time.time()):
            try:
                await self.client.cancel(job.job_id)
            except SlurmFailure as e:  # tried again at the next reading
                self.log.warning("a Slurm job Hops disowned could not be cancelled",
                                 slurm_job=job.job_id, name=job.name, error=e.error)
                continue
            self.strays.cancelled(job)
            self.log.warning("Slurm job Hops disowned cancelled", slurm_job=job.job_id,
                             name=job.name, state=job.job_state, node=job.nodes)

    async def next_within(self, timeout_s: float, after: float = 0.0) -> None:
        """:meth:`next`, or :class:`SlurmFailure` (``slurm_no_reading``) when
        no reading comes within ``timeout_s``: Slurm does not answer."""
        try:
            await asyncio.wait_for(self.next(after), timeout_s)
        except TimeoutError:
            raise SlurmFailure("slurm_no_reading", f"Slurm could not be read for "
                               f"{timeout_s:g} s") from None

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.read()
                if self._failing:
                    self.log.info("Slurm answers again")
                self._failing = False
            except SlurmFailure as e:
                if not self._failing:
                    self.log.warning("Slurm cannot be read; keeping the last reading",
                                     code=e.code, error=e.error)
                self._failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.poll_s)

    async def next(self, after: float = 0.0) -> None:
        """Until a reading that began after ``after`` (time.time()); the
        next reading when ``after`` is 0."""
        while True:
            await self._fresh.wait()
            if self.read_at >= after:
                return

    def node_alive(self, name: str) -> bool:
        """False once Slurm has said the node is dead for ``down_s`` on end,
        or UNKNOWN ten times that long (or no longer lists it in the partition):
        :func:`shared.slurm_nodes.node_counted_alive`."""
        return node_counted_alive(name in self.nodes, self.read_at,
                                  self._dead_since.get(name), self.down_s,
                                  self._undetermined_since.get(name))

