"""The placer's decisions as data (pure): the stops, retunes and starts a
plan turns into, the problems it meets, and the idempotency keys of its
commands.

They stand apart from the two steps that produce them, what a plan changes
(:mod:`services.placer.diff`) and what each start books
(:mod:`services.placer.booking`), which both import them, and from the shell
(:mod:`services.placer.service`) that sends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from shared.configuration import Configuration
from shared.events import ALREADY_STARTED, CommandAck
from shared.ids import JobId, ServerId
from shared.records import Placement

Mode = Literal["run", "profile"]
NOT_FOUND = "not_found"
INVALID = "invalid"
CONFLICT = "conflict"
UNKNOWN_SERVER = "unknown_server"
NOT_IN_PLAN = "not in the plan"
RESIZE = "resize"

# Benign races: plan entries right when the plan was made that the cluster
# overtook before the placer applied them. They are skipped, logged at
# debug and counted (``hops_placer_skipped_total{reason}``), not reported
# as errors; the next plan, made from the changed cluster, sorts them out.
JOB_ENDED = "job_ended"  # the job finished, failed or was cancelled meanwhile
STILL_PROFILING = "still_profiling"  # its profiling run has not been released yet
ALREADY_RUNNING = "already_running"  # asked to profile, but an earlier plan started it
SERVER_GONE = "server_gone"  # the server was lost or removed meanwhile
RACES = frozenset({JOB_ENDED, STILL_PROFILING, ALREADY_RUNNING, SERVER_GONE})


@dataclass(frozen=True)
class Stop:
    """Stop ``placement``'s job everywhere; ``resize``: it restarts in this plan."""

    job_id: JobId
    placement: Placement
    resize: bool
    reason: str


@dataclass(frozen=True)
class Want:
    """Start ``job_id`` on ``configuration`` (for profiling: the servers added)."""

    job_id: JobId
    configuration: Configuration
    mode: Mode
    resize: bool = False


@dataclass(frozen=True)
class Retune:
    """Change the extras of ``placement``'s running job in place, to those
    of ``configuration`` (the same GPU parts)."""

    job_id: JobId
    placement: Placement
    configuration: Configuration

    @property
    def servers(self) -> tuple[ServerId, ...]:
        """The servers where the job's holding changes."""
        old, new = self.placement.configuration, self.configuration
        if old.mba_percent != new.mba_percent:  # the cap is the job's, on every server
            return new.servers
        return tuple(s for s in new.servers if old.demand_on(s) != new.demand_on(s))

    @property
    def shrinks(self) -> bool:
        """Whether it only gives cores back: booked and sent first, so a
        retune growing on the same server finds them free."""
        old = self.placement.configuration
        return all(self.configuration.cores_on(s) <= old.cores_on(s)
                   for s in self.configuration.servers)

    @property
    def retuned(self) -> Placement:
        """The placement once every server acknowledged."""
        return msgspec.structs.replace(self.placement, configuration=self.configuration)


@dataclass(frozen=True)
class Launch:
    """One ``start_job`` command: its server, the configuration it carries
    (the whole placement for a run, the server alone for a profiling run)
    and the server's GPU indices."""

    server: ServerId
    configuration: Configuration
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Start:
    """The launches of one job, and its ``hops_alloc`` entry once all are acknowledged."""

    job_id: JobId
    placement: Placement
    launches: tuple[Launch, ...]
    resize: bool


@dataclass(frozen=True)
class Problem:
    """A plan entry not applied; ``race`` (one of :data:`RACES`) when the
    cluster overtook it, empty when it is an error."""

    job_id: JobId
    code: str
    error: str
    race: str = ""


@dataclass(frozen=True)
class Changes:
    stops: tuple[Stop, ...] = ()
    wants: tuple[Want, ...] = ()
    problems: tuple[Problem, ...] = ()
    retunes: tuple[Retune, ...] = ()


@dataclass(frozen=True)
class Commands:
    """A plan's commands in the order they run: every stop, then every
    retune, then the starts."""

    stops: tuple[Stop, ...] = ()
    starts: tuple[Start, ...] = ()
    problems: tuple[Problem, ...] = ()
    retunes: tuple[Retune, ...] = ()


def adoption_problem(servers: Sequence[ServerId], acks: Sequence[CommandAck]) -> str | None:
    """Why a start every server acknowledged (``acks``, one per server) does
    not run as one job, or None when it does. A server answers
    :data:`~shared.events.ALREADY_STARTED` when the job already runs there
    as asked, started by an earlier placer's start (``started_by``): the
    job's processes meet only if all its servers run that one start, never
    when some run an earlier start and others this one."""
    earlier = {a.started_by.rpartition("@")[0] for a in acks if a.code == ALREADY_STARTED}
    if not earlier:
        return None
    fresh = [s for s, a in zip(servers, acks, strict=True) if a.code != ALREADY_STARTED]
    if fresh:
        return (f"it already ran on {', '.join(s for s in servers if s not in fresh)} "
                f"from an earlier start and started now on {', '.join(fresh)}")
    if len(earlier) > 1:
        return f"its servers run it from different starts ({', '.join(sorted(earlier))})"
    return None


def adopted(placement: Placement, servers: Sequence[ServerId],
            acks: Sequence[CommandAck]) -> Placement:
    """``placement`` with the GPU indices the job runs on where its server
    answered :data:`~shared.events.ALREADY_STARTED` (the earlier start's,
    which this plan may have numbered otherwise)."""
    held = {s: a.gpu_indices for s, a in zip(servers, acks, strict=True)
            if a.code == ALREADY_STARTED}
    if not held:
        return placement
    return msgspec.structs.replace(placement, gpu_indices={**placement.gpu_indices, **held})


def placement_key(prefix: str, job: JobId) -> str:
    return f"{prefix}:{job}"


def command_key(verb: str, prefix: str, job: JobId, server: ServerId) -> str:
    """The idempotency key of one command: the same plan delivered again
    sends the same keys, so an executor acts on each at most once."""
    return f"{verb}:{prefix}:{job}@{server}"


def plan_prefix(term: int, round_: int, seq: int) -> str:
    """Names one plan: leader term, round, and the plan's stream sequence
    (several plans share a round, §3.6)."""
    return f"t{term}.r{round_}.p{seq}"
