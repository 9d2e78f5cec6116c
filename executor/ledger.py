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
* A stop of a job that does not run here is refused with ``not_found``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from shared.cluster import Server
from shared.events import INVALID, CommandAck, StartJob, StopJob
from shared.ids import JobId
from shared.resources import UNITS, Ledger, OverAllocation, Resources

CONFLICT = "conflict"
NOT_FOUND = "not_found"


@dataclass(frozen=True)
class Booking:
    """A job running on this node: its GPUs and the command that started it."""

    job_id: JobId
    gpu_indices: tuple[int, ...]
    mode: str
    key: str


class NodeLedger:
    """The jobs of one server and the acknowledgements already given."""

    def __init__(self, server: Server, max_keys: int = 4096) -> None:
        self.server = server
        self.max_keys = max_keys
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

    def refuse_start(self, cmd: StartJob) -> CommandAck | None:
        """The refusal of ``cmd``, or None when it may start."""
        if cmd.server_id != self.server.id:
            return _refusal(cmd.key, INVALID, f"this executor runs {self.server.id}, "
                                              f"not {cmd.server_id}")
        bad = [i for i in cmd.gpu_indices if i >= self.server.gpus]
        if bad:
            return _refusal(cmd.key, INVALID, f"{self.server.id} has {self.server.gpus} GPUs; "
                                              f"no GPU index {bad[0]}")
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
        return None

    def refuse_stop(self, cmd: StopJob) -> CommandAck | None:
        if cmd.job_id not in self._jobs:
            return _refusal(cmd.key, NOT_FOUND, f"job {cmd.job_id} does not run on "
                                                f"{self.server.id}")
        return None

    # --- bookings ---------------------------------------------------------------------

    def book(self, cmd: StartJob) -> Booking:
        """Record that ``cmd``'s job runs here (after :meth:`refuse_start` said yes)."""
        booking = Booking(cmd.job_id, tuple(cmd.gpu_indices), cmd.mode, cmd.key)
        self._jobs[cmd.job_id] = booking
        demand = cmd.configuration.demand_on(self.server.id)
        try:
            self._held.book(cmd.job_id, {self.server.id: demand})
        except OverAllocation:  # an adopted job beyond what is left: it holds the rest
            free = self._held.free(self.server.id)
            self._held.book(cmd.job_id, {self.server.id: demand.minus(demand.minus(free))})
        return booking

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
