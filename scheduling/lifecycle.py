"""One job's lifecycle: a pure state machine, ``event -> state`` (Hops §3.1, §3.6).

The simulator and the live scheduler both move jobs through :func:`step`,
so the two cannot drift apart. A job's :class:`Life` is its phase, the one
configuration it holds while running, its restart count and the times it
first started and ended; every other number (wait, attained service,
progress) is the shells' bookkeeping.

Phases: ``submitted`` → ``profiling`` (§3.2) → ``queued`` → ``running`` →
``queued`` ... → ``finished`` / ``failed`` / ``cancelled``, which are final.
What moves a job is either a job event of the live wire contract
(:data:`shared.events.JobEvent`) or one of the scheduler's own decisions
(:data:`Decision`: send a job to profiling, queue it once its profiles
suffice), which no stream carries.

**One definition of a restart**: every start of the job on a configuration
is a checkpoint-restart and costs its restart time (§3.6), the first start
included (it loads the model and data as a restart does): ``restarts``
grows by one for each accepted ``job_started`` and each accepted
``job_resized``. The simulator always counted this way; Sia's restart
factor (Eq. 2) reads the number.

An event that is not valid in a job's phase changes nothing and comes back
as :class:`Refused` with the reason; there is no default branch, so an event
type added to the union without a transition fails the type check
(``assert_never``) and raises at run time instead of moving the job.
"""

from __future__ import annotations

from typing import TypeAlias, assert_never

import msgspec

from shared import events as ev
from shared.configuration import Configuration
from shared.ids import JobId
from shared.records import FINAL_PHASES, JobPhase

# Before its profiles cover what it needs, a job's starts and stops are its
# profiling runs' (§3.2): they move no phase.
PROFILING_PHASES: frozenset[str] = frozenset({"submitted", "profiling"})


class Life(msgspec.Struct, frozen=True, kw_only=True):
    """Where one job is in its lifecycle; see the module docstring."""

    phase: JobPhase = "submitted"
    configuration: Configuration | None = None
    restarts: int = 0
    first_start: float | None = None
    finished_at: float | None = None

    @property
    def final(self) -> bool:
        return self.phase in FINAL_PHASES


class Refused(msgspec.Struct, frozen=True):
    """An event that changes nothing in the job's phase, and why."""

    reason: str


class Decision(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    """Base of the scheduler's own decisions on a job (no stream carries them)."""

    job_id: JobId
    at: float = 0.0


class Profile(Decision, frozen=True, tag="profile"):
    """A plan sends the job to profiling: a new job, or a waiting one that
    lacks a profile on a type that is no longer busy (§3.2)."""


class Queue(Decision, frozen=True, tag="queue"):
    """The job's profiles now cover what it needs: it waits in the queue."""


class Retune(Decision, frozen=True, tag="retune"):
    """A running job's cores or memory change in place (CODA's allocator,
    §V-B): the same GPUs, another ``configuration``; no restart is counted."""

    configuration: Configuration


Transition: TypeAlias = ev.JobEvent | Profile | Queue | Retune
Outcome: TypeAlias = Life | Refused

PROFILING_RUN = "profiling run"


def step(life: Life | None, event: Transition) -> Outcome:
    """The job's life after ``event`` (``None``: a job not yet submitted)."""
    if life is None:
        if isinstance(event, ev.JobSubmitted):
            return Life()
        return Refused("unknown job")
    if life.final:
        return Refused(f"job is {life.phase}")
    match event:
        case ev.JobSubmitted():
            return Refused("already submitted")
        case ev.JobProfiled():
            # Profiles may arrive at any phase (a profiler replica catching
            # up); only a job still waiting for its first is moved.
            return _to(life, "profiling") if life.phase == "submitted" else life
        case ev.JobStarted() | ev.JobResized():
            return _start(life, event.configuration, event.at)
        case ev.JobStopped():
            return _stop(life)
        case ev.JobFinished():
            return _end(life, "finished", event.at)
        case ev.JobFailed():
            return _end(life, "failed", event.at)
        case ev.JobCancelled():
            return _end(life, "cancelled", event.at)
        case ev.JobHeld() | ev.JobReleased():
            return life  # a hold moves no phase: the shells keep ``held``
        case Profile():
            return _profile(life)
        case Queue():
            return _queue(life)
        case Retune():
            return _retune(life, event.configuration)
        case _:
            assert_never(event)


def _to(life: Life, phase: JobPhase) -> Life:
    return msgspec.structs.replace(life, phase=phase)


def _start(life: Life, config: Configuration, at: float) -> Outcome:
    """A start or a resize: one (re)start on ``config`` (the one definition).
    A running job started again lost its old configuration: it holds one."""
    if life.phase in PROFILING_PHASES:
        return Refused(PROFILING_RUN)
    return msgspec.structs.replace(
        life,
        phase="running",
        configuration=config,
        restarts=life.restarts + 1,
        first_start=at if life.first_start is None else life.first_start,
    )


def _stop(life: Life) -> Outcome:
    """Back to the queue. A queued job stays queued: a node loss released it
    as the placer stopped it, and the shell keeps the larger progress."""
    if life.phase in PROFILING_PHASES:
        return Refused(PROFILING_RUN)
    return msgspec.structs.replace(life, phase="queued", configuration=None)


def _end(life: Life, phase: JobPhase, at: float) -> Life:
    return msgspec.structs.replace(life, phase=phase, configuration=None, finished_at=at)


def _profile(life: Life) -> Outcome:
    if life.phase not in ("submitted", "queued"):
        return Refused(f"job is {life.phase}, not waiting")
    return _to(life, "profiling")


def _retune(life: Life, config: Configuration) -> Outcome:
    cur = life.configuration
    if life.phase != "running" or cur is None:
        return Refused(f"job is {life.phase}, not running")
    if cur.parts != config.parts:
        return Refused(f"a retune keeps the GPUs: {cur} -> {config}")
    return msgspec.structs.replace(life, configuration=config)


def _queue(life: Life) -> Outcome:
    if life.phase not in PROFILING_PHASES:
        return Refused(f"job is {life.phase}, not being profiled")
    return _to(life, "queued")

