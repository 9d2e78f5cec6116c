"""What a node executor needs from the part that runs jobs: a backend.

:mod:`executor.service` holds everything both kinds of executor share (the
command handling, the ledger, idempotency, registration, heartbeats, the
verdicts published for a job). A backend only runs jobs:

* :class:`executor.emulated.EmulatedBackend` runs each job as one
  ``python -m executor.job`` process that trains nothing;
* :class:`executor.real.RealBackend` runs the job's own command, one process
  per GPU, and survives its own restart (:mod:`executor.adopt`).

A backend first judges a start (:meth:`Backend.check`), then spawns it
(:meth:`Backend.spawn`) and hands back a :class:`JobHandle`, which the
service acknowledges once :meth:`JobHandle.started` says so, stops with
:meth:`JobHandle.terminate`, changes the cores (and memory bandwidth cap)
of with :meth:`JobHandle.retune` and follows to its :class:`Outcome`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec
from structlog.typing import FilteringBoundLogger

from shared.errors import CodedError
from shared.events import JobFailed, JobFinished, StartJob
from shared.ids import JobId

LOST_LISTED_S = 30.0  # how long node heartbeats list a lost job


def profile_msg_id(cmd: StartJob) -> str:
    """The JetStream msg id of a profiling run's report: once per start,
    whichever backend ran it."""
    return f"{cmd.job_id}:profile_reported:{cmd.server_id}:{cmd.key}"


def with_cap(cmd: StartJob, percent: int) -> StartJob:
    """``cmd`` as if its job had started with its memory bandwidth capped at
    ``percent`` (CODA §V-D), as :func:`executor.cores.with_cores` for its
    cores: what a running job holds after a ``set_cores``, as the executor
    keeps it (a real executor's state file: an adopted job keeps its cap)."""
    config = msgspec.structs.replace(cmd.configuration, mba_percent=percent)
    return msgspec.structs.replace(cmd, configuration=config)


class LostJobs:
    """Jobs a backend found lost (a process or Slurm job that a restarted
    executor expected and did not find), listed in the node's heartbeats
    for :data:`LOST_LISTED_S` after: the monitor releases each at once,
    with no grace (docs/events.md)."""

    def __init__(self) -> None:
        self._at: dict[JobId, float] = {}  # job -> when it was found lost (monotonic)

    def mark(self, job: JobId) -> None:
        self._at[job] = time.monotonic()

    def clear(self, job: JobId) -> None:
        """It runs here again: no longer lost."""
        self._at.pop(job, None)

    def listed(self) -> tuple[JobId, ...]:
        now = time.monotonic()
        for job in [j for j, t in self._at.items() if now - t > LOST_LISTED_S]:
            del self._at[job]
        return tuple(sorted(self._at))


@dataclass(frozen=True)
class Refusal:
    """Why a start cannot run here. ``fail_job``: it cannot run anywhere
    either (e.g. no command to run), so the job gets ``job_failed`` rather
    than waiting for ever."""

    code: str
    error: str
    fail_job: bool = False


class StartFailed(Exception):
    """The job's command could not be started (no such program, not
    executable): the start is refused and the job fails, wherever it would run."""

    def __init__(self, error: str, exit_code: int | None = None, log_tail: str = "") -> None:
        super().__init__(error)
        self.error = error
        self.exit_code = exit_code
        self.log_tail = log_tail


class CommandRefused(CodedError):
    """What runs the jobs could not carry a start or stop out, through no
    fault of the job: Slurm refused the submission, or did not answer in
    time. The command is refused with ``code`` (stable) and ``words`` (the
    ack's ``error``); the job neither fails nor changes (a refused start
    books nothing, a refused stop leaves the job as it was)."""


@dataclass(frozen=True)
class Outcome:
    """How a job's processes on this node ended. ``event`` is what the
    executor publishes for it when nobody asked it to stop (None: nothing,
    e.g. the emulated lead published its own ``job_finished``)."""

    exit_code: int | None
    log_tail: str = ""
    event: JobFinished | JobFailed | None = None


# Called when a job's processes said they are done and are exiting (the
# ledger then stops listing the job as running; see NodeLedger.ending).
OnEnding = Callable[[], None]


class JobHandle(Protocol):
    """One job's processes on this node, as the service sees them."""

    cmd: StartJob
    log: FilteringBoundLogger

    @property
    def beats_itself(self) -> bool:
        """True when the job publishes its own ``job_heartbeat`` (emulated)."""

    @property
    def samples_done(self) -> float:
        """The job's progress as last reported."""

    @property
    def stopping(self) -> bool:
        """A stop was asked for: the end is no failure."""

    @property
    def cores(self) -> tuple[int, ...]:
        """The core ids the job's threads are pinned to (empty: not pinned)."""

    def retune(self, count: int, cores: tuple[int, ...], mba_percent: int = 100) -> None:
        """The job now holds ``count`` cores here, pinned to ``cores``
        (empty: not pinned), its memory bandwidth capped at ``mba_percent``
        (100: no cap; CODA §V-D), in place: its processes keep running.
        :class:`executor.mba.MbaError` when the cap cannot be applied:
        then nothing changed."""

    async def started(self, timeout: float) -> str | Refusal | None:
        """None once the job runs; else why it did not start (a
        :class:`Refusal` names its code; words alone are ``internal``)."""

    async def terminate(self, grace: float) -> None:
        """SIGTERM, SIGKILL after ``grace`` seconds; returns once it ended
        (:class:`CommandRefused` when it cannot be stopped now)."""

    async def wait(self) -> Outcome:
        """The job's end on this node."""

    def stop_details(self) -> tuple[int | None, str]:
        """The exit code and log tail a stop acknowledges (after terminate)."""


class Backend(Protocol):
    """Runs jobs for :class:`executor.service.NodeExecutor`."""

    name: str
    models: tuple[str, ...]  # what it can run (register_node.models; empty: any)

    @property
    def alive(self) -> bool:
        """Whether the node counts as up (False: its heartbeats stop, and the
        monitor finds it dead; Slurm's view of a node, :mod:`executor.slurm`)."""

    def check(self, cmd: StartJob) -> Refusal | None:
        """The refusal of a start the ledger accepted, or None."""

    async def spawn(self, cmd: StartJob, on_ending: OnEnding,
                    cores: tuple[int, ...] = ()) -> JobHandle:
        """Start ``cmd``'s processes, pinned to ``cores`` (empty: not
        pinned); :class:`StartFailed` when they cannot be, anywhere;
        :class:`CommandRefused` when not now, through no fault of the job."""

    async def recover(self, on_ending: Callable[[JobId], OnEnding]) -> list[JobHandle]:
        """The jobs still running from before a restart (adopted)."""

    def lost(self) -> tuple[JobId, ...]:
        """Jobs whose processes were gone when the executor came back."""

    def forget(self, job: JobHandle) -> None:
        """The job ended here (or was stopped): nothing more to keep of it."""

    async def tick(self) -> None:
        """Periodic housekeeping (called every heartbeat)."""

    async def close(self) -> None:
        """The executor stops (after its jobs were stopped)."""
