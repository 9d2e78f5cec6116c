"""What one node executor has agreed to run: the pure bookkeeping behind its
answers to ``start_job`` and ``stop_job``.

* A command ``key`` seen before gets the acknowledgement it got the first
  time and nothing is done again (the placer retries with the same key).
* A start is refused with ``invalid`` when it names another server or GPU
  indices this server does not have, or demands more of a resource (CPU
  cores, memory) than the server has at all; and with ``conflict`` when the
  job already runs here, any of its GPU indices is in use, or its cores or
  memory would be over-allocated: a GPU is never booked twice, nor a server
  over-allocated in any resource, whatever the placer believes.
* Each job holds its configuration's whole demand on this server
  (:meth:`shared.configuration.Configuration.demand_on`) on a
  :class:`shared.resources.Ledger` of the server's capacity.
* A start of a job that already runs here exactly as it asks (another
  key: a new placer starting what its predecessor started) is the same
  start (:meth:`NodeLedger.same_start`): the executor acknowledges it with
  ``already_started`` rather than refusing it.
* A stop of a job that does not run here is refused with ``not_found``.
* With a core *pool* (a real executor that pins, :mod:`executor.cores`),
  a run holding N cores also gets N concrete core ids no other job here
  holds, kept in its :class:`Booking` (and, through the start's record, in
  the real backend's state file, so an adopted job keeps them); a start
  is refused with ``conflict`` when the pool has fewer free. Without a pool
  (emulated executors, or ``--cpu-affinity``) cores are only counted.
* ``set_cores`` changes a running job's cores in place: refused with
  ``not_found`` for a job not here, ``invalid`` for a profiling run, a CPU
  job left without cores or more than the server has, and ``conflict``
  when the cores are not free; nothing changes on a refusal. The new ids
  keep those of the old the job still may hold. A change the job's
  processes do not take (:meth:`NodeLedger.retune`'s ``take`` raises) is
  not booked either.
* A start or ``set_cores`` capping the job's memory bandwidth
  (``mba_percent`` < 100, CODA §V-D) on a server without MBA
  (``server.mba`` False) is refused with ``invalid``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import msgspec

from executor.cores import CoreShortage, NoTopology, Topology, choose_cores
from shared.cluster import Server
from shared.configuration import Configuration
from shared.events import INVALID, CommandAck, SetCores, StartJob, StopJob
from shared.ids import JobId
from shared.resources import NOTHING, UNITS, Ledger, OverAllocation, Resources

CONFLICT = "conflict"
NOT_FOUND = "not_found"
Take = Callable[[int, tuple[int, ...], int], None]  # count, core ids, mba_percent


@dataclass(frozen=True)
class Booking:
    """A job running on this node: its GPUs, the command that started it
    (its key and the whole configuration it carried) and the core ids it is
    pinned to (empty: not pinned)."""

    job_id: JobId
    gpu_indices: tuple[int, ...]
    mode: str
    key: str
    cores: tuple[int, ...] = ()
    configuration: Configuration | None = None


def pinned_count(cmd: StartJob) -> int:
    """How many cores a start holds on its server (a profiling run: none)."""
    return cmd.configuration.demand_on(cmd.server_id).cores if cmd.mode == "run" else 0


class NodeLedger:
    """The jobs of one server and the acknowledgements already given."""

    def __init__(self, server: Server, max_keys: int = 4096,
                 pool: Collection[int] | None = None, topology: Topology | None = None) -> None:
        self.server = server
        self.max_keys = max_keys
        self.pool = frozenset(pool) if pool is not None else None
        self.topology = topology or NoTopology()
        self._acks: OrderedDict[str, CommandAck] = OrderedDict()
        self._jobs: dict[JobId, Booking] = {}
        self._ending: set[JobId] = set()
        self._held = Ledger({server.id: server.capacity})

    # --- idempotency ----------------------------------------------------------------

    def answered(self, key: str) -> CommandAck | None:
        """The acknowledgement already given to ``key``, if any."""
        return self._acks.get(key)

    def remember(self, ack: CommandAck) -> CommandAck:
        """Keep ``ack`` as the answer to its key (the oldest keys age out)."""
        self._acks[ack.key] = ack
        self._acks.move_to_end(ack.key)
        while len(self._acks) > self.max_keys:
            self._acks.popitem(last=False)
        return ack

    # --- decisions --------------------------------------------------------------------

    def same_start(self, cmd: StartJob) -> Booking | None:
        """The booking of ``cmd``'s job when it already runs here as ``cmd``
        asks (another key: a placer that did not see its predecessor's start
        acknowledged sends it again): the same mode, configuration (so as
        many GPUs) and holding on this server, on the GPU indices the
        booking names, which a new placer's booking may have numbered
        otherwise. None otherwise, and for a job that said it finished
        (:meth:`refuse_start` then says why)."""
        booking = self._jobs.get(cmd.job_id)
        if (booking is None or cmd.job_id in self._ending or cmd.server_id != self.server.id
                or booking.mode != cmd.mode or booking.configuration != cmd.configuration):
            return None
        held = self._held.held_by(cmd.job_id).get(self.server.id, NOTHING)
        return booking if held == cmd.configuration.demand_on(self.server.id) else None

    def refuse_start(self, cmd: StartJob) -> CommandAck | None:
        """The refusal of ``cmd``, or None when it may start."""
        if cmd.server_id != self.server.id:
            return _refusal(cmd.key, INVALID, f"this executor runs {self.server.id}, "
                                              f"not {cmd.server_id}")
        bad = [i for i in cmd.gpu_indices if i >= self.server.gpus]
        if bad:
            return _refusal(cmd.key, INVALID, f"{self.server.id} has {self.server.gpus} GPUs; "
                                              f"no GPU index {bad[0]}")
        no_mba = self._mba_refusal(cmd.key, cmd.job_id, cmd.configuration.mba_percent)
        if no_mba is not None:
            return no_mba
        demand = cmd.configuration.demand_on(self.server.id)
        beyond = demand.short_of(self.server.capacity)
        if beyond:
            name = beyond[0]
            return _refusal(cmd.key, INVALID, f"{self.server.id} has "
                                              f"{self.server.capacity[name]} {UNITS[name]}; "
                                              f"job {cmd.job_id} needs {demand[name]}")
        if cmd.job_id in self._jobs:
            return _refusal(cmd.key, CONFLICT, f"job {cmd.job_id} already runs on "
                                               f"{self.server.id}")
        busy = sorted(set(cmd.gpu_indices) & self.in_use())
        if busy:
            owners = sorted(b.job_id for b in self._jobs.values() if set(b.gpu_indices) & set(busy))
            return _refusal(cmd.key, CONFLICT, f"GPUs {busy} of {self.server.id} are in use "
                                               f"by {', '.join(owners)}")
        why = self._held.refusal({self.server.id: demand}, cmd.job_id)
        if why is not None:
            holders = ", ".join(sorted(self._held.holders()))
            return _refusal(cmd.key, CONFLICT, f"{why} (held by {holders})")
        return self._pool_refusal(cmd.key, cmd.job_id, pinned_count(cmd))

    def _pool_refusal(self, key: str, job: JobId, count: int) -> CommandAck | None:
        """``conflict`` when the pool cannot give ``job`` ``count`` cores."""
        if self.pool is None or count <= 0:
            return None
        try:
            choose_cores(count, self.pool, self.taken(but=job))
        except CoreShortage as e:
            return _refusal(key, CONFLICT, f"{self.server.id}: {e} for job {job} "
                                           f"(pinned: {self._pinned_text(job)})")
        return None

    def _mba_refusal(self, key: str, job: JobId, percent: int) -> CommandAck | None:
        """``invalid`` for a cap on a server that cannot throttle bandwidth."""
        if percent >= 100 or self.server.mba:
            return None
        return _refusal(key, INVALID, f"{self.server.id} has no memory bandwidth allocation "
                                      f"(MBA); job {job} cannot be capped at {percent}%")

    def _pinned_text(self, but: JobId) -> str:
        held = [f"{b.job_id} {list(b.cores)}" for b in self._jobs.values()
                if b.cores and b.job_id != but]
        return ", ".join(sorted(held)) or "none"

    def refuse_retune(self, cmd: SetCores) -> CommandAck | None:
        """The refusal of ``cmd``, or None when the job may hold its cores."""
        if cmd.server_id != self.server.id:
            return _refusal(cmd.key, INVALID, f"this executor runs {self.server.id}, "
                                              f"not {cmd.server_id}")
        booking = self._jobs.get(cmd.job_id)
        if booking is None or cmd.job_id in self._ending:
            return _refusal(cmd.key, NOT_FOUND, f"job {cmd.job_id} does not run on "
                                                f"{self.server.id}")
        if booking.mode != "run":
            return _refusal(cmd.key, INVALID, f"job {cmd.job_id} is profiling on "
                                              f"{self.server.id}: it holds no cores")
        no_mba = self._mba_refusal(cmd.key, cmd.job_id, cmd.mba_percent)
        if no_mba is not None:
            return no_mba
        if not booking.gpu_indices and cmd.cores == 0:
            return _refusal(cmd.key, INVALID, f"CPU job {cmd.job_id} cannot run on no cores")
        if cmd.cores > self.server.cores:
            return _refusal(cmd.key, INVALID, f"{self.server.id} has {self.server.cores} "
                                              f"{UNITS['cores']}; job {cmd.job_id} asks "
                                              f"for {cmd.cores}")
        why = self._held.refusal({self.server.id: self._retuned(cmd)}, cmd.job_id)
        if why is not None:
            holders = ", ".join(sorted(self._held.holders()))
            return _refusal(cmd.key, CONFLICT, f"{why} (held by {holders})")
        return self._pool_refusal(cmd.key, cmd.job_id, cmd.cores)

    def _retuned(self, cmd: SetCores) -> Resources:
        """What ``cmd``'s job holds here once it holds ``cmd.cores``."""
        held = self._held.held_by(cmd.job_id).get(self.server.id, NOTHING)
        return msgspec.structs.replace(held, cores=cmd.cores)

    def refuse_stop(self, cmd: StopJob) -> CommandAck | None:
        if cmd.job_id not in self._jobs:
            return _refusal(cmd.key, NOT_FOUND, f"job {cmd.job_id} does not run on "
                                                f"{self.server.id}")
        return None

    # --- bookings ---------------------------------------------------------------------

    def book(self, cmd: StartJob, cores: tuple[int, ...] | None = None) -> Booking:
        """Record that ``cmd``'s job runs here (after :meth:`refuse_start`
        said yes), pinned to ``cores`` (an adopted job's, as recorded) or to
        cores chosen now (None)."""
        demand = cmd.configuration.demand_on(self.server.id)
        try:
            self._held.book(cmd.job_id, {self.server.id: demand})
        except OverAllocation:  # an adopted job beyond what is left: it holds the rest
            free = self._held.free(self.server.id)
            self._held.book(cmd.job_id, {self.server.id: demand.minus(demand.minus(free))})
        if cores is None:
            cores = self._choose(cmd.job_id, pinned_count(cmd), tuple(cmd.gpu_indices))
        booking = Booking(cmd.job_id, tuple(cmd.gpu_indices), cmd.mode, cmd.key, cores,
                          cmd.configuration)
        self._jobs[cmd.job_id] = booking
        return booking

    def _choose(self, job: JobId, count: int, gpus: tuple[int, ...],
                keep: tuple[int, ...] = ()) -> tuple[int, ...]:
        """``count`` free cores of the pool for ``job`` (see executor.cores);
        when fewer are free (an adopted job), those that are."""
        if self.pool is None or count <= 0:
            return ()
        taken = self.taken(but=job)
        near = self.topology.near(gpus)
        try:
            return choose_cores(count, self.pool, taken, near, keep)
        except CoreShortage:
            return tuple(sorted(self.pool - taken))

    def retune(self, cmd: SetCores, take: Take | None = None) -> Booking:
        """``cmd``'s job now holds ``cmd.cores`` cores here (after
        :meth:`refuse_retune` said yes); its booking with the new core ids.
        ``take`` (the job's :meth:`~executor.backend.JobHandle.retune`) is
        given the count, the core ids and ``cmd.mba_percent``; should it
        raise, the job holds what it held before and the error goes on."""
        old = self._jobs[cmd.job_id]
        held = self._held.held_by(cmd.job_id).get(self.server.id, NOTHING)
        self._held.book(cmd.job_id, {self.server.id: self._retuned(cmd)})
        booking = replace(old, cores=self._choose(cmd.job_id, cmd.cores, old.gpu_indices,
                                                  keep=old.cores))
        self._jobs[cmd.job_id] = booking
        try:
            if take is not None:
                take(cmd.cores, booking.cores, cmd.mba_percent)
        except BaseException:
            self._held.book(cmd.job_id, {self.server.id: held})  # it fitted before: it fits
            self._jobs[cmd.job_id] = old
            raise
        return booking

    def taken(self, but: JobId | None = None) -> set[int]:
        """The core ids the jobs here (but ``but``) are pinned to."""
        return {c for b in self._jobs.values() if b.job_id != but for c in b.cores}

    def release(self, job_id: JobId) -> Booking | None:
        self._ending.discard(job_id)
        self._held.release(job_id)
        return self._jobs.pop(job_id, None)

    def ending(self, job_id: JobId) -> None:
        """The job's process said it is done (its report is out) and is
        exiting: it keeps its GPUs until it is gone, but the node no longer
        lists it as running, so that its silence reads as an end, not a hang."""
        if job_id in self._jobs:
            self._ending.add(job_id)

    def booking(self, job_id: JobId) -> Booking | None:
        return self._jobs.get(job_id)

    def running(self) -> tuple[JobId, ...]:
        """The jobs whose processes run and have not said they are done."""
        return tuple(sorted(set(self._jobs) - self._ending))

    def in_use(self) -> set[int]:
        return {i for b in self._jobs.values() for i in b.gpu_indices}

    def allocated(self) -> Resources:
        """What the jobs here hold, in every resource."""
        return self._held.used(self.server.id)


def _refusal(key: str, code: str, error: str) -> CommandAck:
    return CommandAck(key=key, ok=False, code=code, error=error)
