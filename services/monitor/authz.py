"""What the monitor accepts from an executor (pure; no I/O).

NATS permissions tie each executor's identity to the subjects that name its
server (``hops.v1.nodes.register.<sid>``, ``hops.v1.nodes.heartbeat.<sid>``,
``hops.v1.jobs.heartbeat.<sid>.<job>``, ``hops.v1.reports.<sid>.<job>``), so
the subject's ``<sid>`` says who speaks; the payload is only a claim. These
checks hold each message to its subject, and each job-scoped one to the
jobs placed on that server:

* a ``register_node`` must register the subject's server;
* a ``node_heartbeat`` must be the subject's server's, and its ``running``
  and ``lost`` entries count only for jobs placed on that server;
* a ``job_heartbeat`` must name the subject's job and server;
* a ``job_heartbeat`` or a report counts only for a job placed on that
  server since it was last submitted (:class:`PlacementHistory`, fed from
  ``hops_alloc``, ``hops_jobs`` and the plans: the placer writes
  ``hops_alloc`` only once every server acknowledged the start, and a start
  an executor refuses as impossible is reported by its ``job_failed``
  alone; a Hare task job is placed on every server a task sequence gives
  it entries on, :func:`sequenced`); a report must name the subject's job and, where it names a
  server, the subject's server, and be one of the messages an executor
  sends (:data:`REPORT_TYPES`).

Whether a job is placed on a server is known a moment after the executor
hears of it (the monitor's watchers and consumers lag the placer's
command). So a report not known to be placed there is judged :class:`Wait`
until its last delivery, then refused; a heartbeat's entries are ignored
at once but audited only if the job is still not placed there a grace
later (:class:`Suspects`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from shared import subjects
from shared.events import (
    JobFailed,
    JobFinished,
    JobHeartbeat,
    Message,
    NodeHeartbeat,
    ProfileReported,
    RegisterNode,
    SampleReported,
    TaskSequence,
)
from shared.ids import JobId, ServerId
from shared.snapshot import Plan

# The messages an executor (or its emulated job process) publishes of a job.
REPORT_TYPES = ("sample_reported", "profile_reported", "job_finished", "job_failed")


@dataclass(frozen=True)
class Placed:
    """The servers a job was placed on since it was submitted at ``submitted_at``
    (None: its record was not seen yet)."""

    submitted_at: float | None = None
    servers: frozenset[ServerId] = frozenset()


@dataclass
class PlacementHistory:
    """Which servers each job is or was placed on since its last submission."""

    jobs: dict[JobId, Placed] = field(default_factory=dict)

    def placed(self, job: JobId, servers: Iterable[ServerId]) -> None:
        """A placement of ``job`` on ``servers`` was written."""
        old = self.jobs.get(job, Placed())
        self.jobs[job] = Placed(old.submitted_at, old.servers | frozenset(servers))

    def submitted(self, job: JobId, submitted_at: float,
                  servers: Iterable[ServerId] = ()) -> None:
        """The job's record says it was submitted at ``submitted_at`` and holds
        ``servers`` now; a new submission forgets the servers of the last one."""
        old = self.jobs.get(job, Placed())
        known = old.servers if old.submitted_at in (None, submitted_at) else frozenset()
        self.jobs[job] = Placed(submitted_at, known | frozenset(servers))

    def forget(self, job: JobId) -> None:
        """The job's record is gone."""
        self.jobs.pop(job, None)

    def on(self, job: JobId, server: ServerId) -> bool:
        return server in self.jobs.get(job, Placed()).servers


# --- verdicts -----------------------------------------------------------------------


@dataclass(frozen=True)
class Relay:
    """Pass the report on to ``subject`` under message id ``msg_id``."""

    subject: str
    msg_id: str


@dataclass(frozen=True)
class Refuse:
    reason: str


@dataclass(frozen=True)
class Wait:
    """Not known to be placed there yet: judge it again later."""

    reason: str


Verdict = Relay | Refuse | Wait


def canonical(msg: Message) -> str | None:
    """Where a report of ``msg``'s type belongs (None: not a report)."""
    if isinstance(msg, SampleReported):
        return subjects.samples(msg.sample.job_id)
    if isinstance(msg, ProfileReported):
        return subjects.profiles(msg.report.job_id)
    if isinstance(msg, JobFinished | JobFailed):
        return subjects.job_events(msg.job_id)
    return None


def _claims(msg: Message) -> tuple[str, str | None]:
    """The job id and the server id (None: none) ``msg`` names."""
    if isinstance(msg, SampleReported):
        return msg.sample.job_id, msg.sample.server_id
    if isinstance(msg, ProfileReported):
        return msg.report.job_id, msg.report.server_id
    return getattr(msg, "job_id", ""), None


def judge_report(msg: Message, sid: str, job: str, msg_id: str, history: PlacementHistory,
                 last_try: bool) -> Verdict:
    """What to do with ``msg``, published on ``hops.v1.reports.<sid>.<job>``
    with ``msg_id`` (the relay's own id when the executor gave none)."""
    kind = str(msg.__struct_config__.tag)
    target = canonical(msg)
    if target is None:
        return Refuse(f"executors may not publish {kind}")
    claimed_job, claimed_server = _claims(msg)
    if claimed_job != job:
        return Refuse(f"{kind} of job {claimed_job} on the subject of job {job}")
    if claimed_server is not None and claimed_server != sid:
        return Refuse(f"{kind} of server {claimed_server} on the subject of server {sid}")
    if history.on(JobId(job), ServerId(sid)):
        return Relay(target, msg_id)
    reason = f"job {job} is not placed on server {sid}"
    return Refuse(reason) if last_try else Wait(reason)


def register_refusal(req: RegisterNode, sid: str) -> str | None:
    """Why server ``sid`` may not send ``req`` (None: it may)."""
    if req.server.id != sid:
        return f"server {sid} may not register server {req.server.id}"
    return None


def heartbeat_refusal(beat: NodeHeartbeat, sid: str) -> str | None:
    """Why server ``sid`` may not send ``beat`` (None: it may)."""
    if beat.server_id != sid:
        return f"server {sid} may not send the heartbeat of server {beat.server_id}"
    return None


def foreign_jobs(beat: NodeHeartbeat, history: PlacementHistory) -> tuple[JobId, ...]:
    """The jobs ``beat`` lists (running or lost) that were never placed on
    its server since their submission: the monitor ignores those entries."""
    listed = sorted(set(beat.running) | set(beat.lost))
    return tuple(j for j in listed if not history.on(j, beat.server_id))


def without_jobs(beat: NodeHeartbeat, jobs: Iterable[JobId]) -> NodeHeartbeat:
    """``beat`` without the entries of ``jobs``."""
    drop = frozenset(jobs)
    if not drop:
        return beat
    return msgspec.structs.replace(beat, running=tuple(j for j in beat.running if j not in drop),
                                   lost=tuple(j for j in beat.lost if j not in drop))


def job_beat_refusal(beat: JobHeartbeat, sid: str, job: str) -> str | None:
    """Why a heartbeat on ``hops.v1.jobs.heartbeat.<sid>.<job>`` is refused
    outright: its payload names another job or server (None: it does not)."""
    if beat.job_id != job:
        return f"job_heartbeat of job {beat.job_id} on the subject of job {job}"
    if beat.server_id != sid:
        return f"job_heartbeat of server {beat.server_id} on the subject of server {sid}"
    return None


Part = tuple[JobId, ServerId]


@dataclass(frozen=True)
class Suspect:
    """A heartbeat entry for a job not known to be placed on its server."""

    job: JobId
    server: ServerId
    subject: str
    first_seen: float


@dataclass
class Suspects:
    """Heartbeat entries ignored for a job not placed on their server,
    audited once the job is still not placed there ``grace`` seconds later
    (before that it may be a start the monitor has not heard of yet)."""

    grace: float
    pending: dict[Part, Suspect] = field(default_factory=dict)

    def saw(self, job: JobId, server: ServerId, subject: str, now: float) -> None:
        self.pending.setdefault((job, server), Suspect(job, server, subject, now))

    def due(self, history: PlacementHistory, now: float) -> list[Suspect]:
        """The suspects to audit now; each is reported once (and forgotten:
        seen again, it is judged again)."""
        out: list[Suspect] = []
        for part, suspect in list(self.pending.items()):
            if history.on(*part):
                del self.pending[part]
            elif now - suspect.first_seen >= self.grace:
                del self.pending[part]
                out.append(suspect)
        return sorted(out, key=lambda s: (s.job, s.server))


def planned(plan: Plan) -> dict[JobId, frozenset[ServerId]]:
    """The servers ``plan`` puts each job on (runs and profiling runs): only
    the scheduler may publish plans, and every start comes from one."""
    out: dict[JobId, frozenset[ServerId]] = {}
    for a in plan.assignments:
        out[a.job_id] = out.get(a.job_id, frozenset()) | frozenset(a.config.servers)
    for task in plan.profiling:
        out[task.job_id] = out.get(task.job_id, frozenset()) | {task.server}
    return out


def sequenced(seq: TaskSequence, sid: str) -> dict[JobId, frozenset[ServerId]]:
    """The jobs a task sequence published on ``hops.v1.tasks.seq.<sid>``
    gives entries on that server (only the scheduler may publish there):
    none when its body names another server than its subject."""
    if seq.server_id != sid:
        return {}
    return {e.job_id: frozenset({seq.server_id}) for g in seq.gpus for e in g.entries}
