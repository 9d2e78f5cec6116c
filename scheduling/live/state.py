"""Job records of the live scheduler and how job events change them.

The leader keeps one :class:`LiveJobRecord` per job in KV ``hops_jobs``
(it is the only writer after admission). A live record is a
:class:`shared.records.JobRecord` with the bookkeeping the planner needs on
top (readers that decode a plain ``JobRecord`` ignore the extra fields):

- ``wait_s``: seconds spent ``queued`` until ``since`` (the latency ratio's
  wait, Eq. 6/8; profiling time is not waiting in the queue, as in the
  simulator);
- ``since``: when the current phase began (a queued job's wait and a running
  job's attained service grow from it);
- ``attained_gpu_s`` and ``run_s_by_type``: GPU-seconds run in total and
  seconds run per GPU type (``attained_by_type`` holds GPU-seconds per type);
- ``run_s``: seconds spent ``running``, every run summed, closed at each
  phase change (what a ``time_limit`` counts, :mod:`.timelimit`);
- ``last_seq``: the ``HOPS_JOBS`` stream sequence of the last event applied,
  so that a redelivered event changes nothing;
- ``hold_seq``: the sequence of the last ``job_held`` or ``job_released``
  applied, so that a hold or release redelivered after later events is
  told from a repeat (:func:`_late_hold`).

Phases: ``submitted`` → ``profiling`` (a plan carries profiling tasks for it,
§3.2) → ``queued`` (``job_profiled`` covers every GPU type of the alive
nodes) → ``running`` (``job_started``) → ``queued`` (``job_stopped``) ... →
``finished`` / ``failed`` / ``cancelled``, which are final. A CPU job
(``kind: cpu``) has no GPU type to be profiled on: it is ``queued`` from its
submission (:func:`new_record`) and never goes to profiling. ``samples_done``
is the largest progress heard of: ``job_heartbeat`` (kept by the shell and
passed in as :attr:`Facts.progress`), the ``samples_done`` of ``job_stopped``
and ``job_resized`` (where the placer knows it) and ``total_samples`` on
``job_finished``.
The phase, the configuration, ``restarts``, ``first_start`` and
``finished_at`` come from the one lifecycle (:mod:`.lifecycle`), which the
simulator uses too: ``restarts`` counts every start, the first included, and
every resize. A ``job_started`` or ``job_stopped`` while the job is still
being profiled belongs to a profiling run and changes no phase; an event the
lifecycle refuses changes only ``last_seq`` and says why.

``reason`` says why a job waits or ended (a stop's reason, a failure's) and
is cleared when it starts. A queued job that fits no GPU type of the alive
nodes is *held*: reason ``unschedulable: ...``, in no plan, until capacity
returns (:func:`hold`). A job a user holds (``job_held``, ``hops hold``)
keeps its phase, has ``held`` set and the reason ``held: ...``, and is in no
plan until ``job_released`` (:func:`scheduling.live.snapshot.build_snapshot`).
While a job runs, the leader writes the progress its
heartbeats report into ``samples_done`` (:func:`with_progress`), so what a
client reads is current.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple, assert_never

import msgspec

from scheduling import lifecycle as lc
from shared import events as ev
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import JobRecord
from shared.wire import HELD, UNKNOWN_TENANT, UNSCHEDULABLE  # also held jobs' reasons

PROFILING_PHASES = lc.PROFILING_PHASES


class LiveJobRecord(JobRecord, frozen=True, kw_only=True):
    """``hops_jobs[job_id]`` as the scheduler writes it; see the module docstring."""

    wait_s: float = 0.0
    since: float = 0.0
    attained_gpu_s: float = 0.0
    run_s_by_type: dict[GpuType, float] = msgspec.field(default_factory=dict)
    run_s: float = 0.0
    last_seq: int = 0
    hold_seq: int = 0


_DECODER = msgspec.json.Decoder(LiveJobRecord)


def encode_record(record: JobRecord) -> bytes:
    return msgspec.json.encode(record)


def decode_record(data: bytes) -> LiveJobRecord:
    """A record from KV (raises ``msgspec.DecodeError`` on bytes that are not one)."""
    return _DECODER.decode(data)


def new_record(spec: JobSpec, at: float, seq: int = 0) -> LiveJobRecord:
    """A new job's record: ``submitted`` (to be profiled), or ``queued`` for a
    CPU job, whose wait starts at once (the lifecycle queues a submitted job)."""
    rec = LiveJobRecord(spec=spec, submitted_at=at, since=at, last_seq=seq)
    if spec.kind == "cpu":
        return _decide(rec, lc.Queue(job_id=rec.job_id, at=at)) or rec
    return rec


class Facts(NamedTuple):
    """What a transition needs besides the record and the event.

    ``server_types`` maps every known server (alive or not) to its GPU type;
    ``required`` is the set of GPU types of the alive nodes; ``progress`` is
    the latest ``samples_done`` a heartbeat reported for the job.
    """

    server_types: Mapping[ServerId, GpuType]
    required: frozenset[GpuType]
    progress: float = 0.0


class Applied(NamedTuple):
    """A transition's result: the new record (``None``: nothing to write)
    and, when nothing changed, why."""

    record: LiveJobRecord | None
    note: str = ""


def running_configs(records: Iterable[JobRecord]) -> dict[JobId, Configuration]:
    """The configuration of every running job."""
    return {
        r.job_id: r.configuration
        for r in records
        if r.phase == "running" and r.configuration is not None
    }


def covered(required: frozenset[GpuType], profiled: Iterable[GpuType]) -> bool:
    """Whether the profiles cover every required type (and there is one)."""
    return bool(required) and required <= set(profiled)


def close_phase(rec: LiveJobRecord, at: float, facts: Facts) -> LiveJobRecord:
    """Account for the phase that ends at ``at``: a queued job's wait, a
    running job's attained service. ``since`` becomes ``at``."""
    held = max(0.0, at - rec.since)
    if rec.phase == "queued":
        return msgspec.structs.replace(rec, wait_s=rec.wait_s + held, since=max(at, rec.since))
    if rec.phase != "running" or rec.configuration is None:
        return msgspec.structs.replace(rec, since=max(at, rec.since))
    by_type = dict(rec.attained_by_type)
    run_s = dict(rec.run_s_by_type)
    for sid, gpus in (p for p in rec.configuration.parts if p[1]):
        gpu_type = facts.server_types.get(sid, GpuType("unknown"))
        by_type[gpu_type] = by_type.get(gpu_type, 0.0) + held * gpus
    for gpu_type in {  # a CPU job's parts (0 GPUs) ran on no GPU type
        facts.server_types.get(s, GpuType("unknown")) for s, g in rec.configuration.parts if g
    }:
        run_s[gpu_type] = run_s.get(gpu_type, 0.0) + held
    return msgspec.structs.replace(
        rec,
        attained_by_type=by_type,
        run_s_by_type=run_s,
        attained_gpu_s=rec.attained_gpu_s + held * rec.configuration.total_gpus,
        run_s=rec.run_s + held,
        since=max(at, rec.since),
    )


def apply_event(rec: LiveJobRecord | None, event: ev.JobEvent, seq: int, facts: Facts) -> Applied:
    """The record after ``event`` (stream sequence ``seq``): the phase from
    the lifecycle (:func:`.lifecycle.step`), the bookkeeping here."""
    if (rec is not None and seq <= rec.last_seq and not _late_end(rec, event)
            and not _late_hold(rec, event, seq)):
        return Applied(None, "already applied")
    outcome = lc.step(None if rec is None else life_of(rec), event)
    match outcome:
        case lc.Refused(reason=why):
            return Applied(None if rec is None else msgspec.structs.replace(
                rec, last_seq=max(rec.last_seq, seq)), why)
        case lc.Life():
            if rec is None:
                assert isinstance(event, ev.JobSubmitted)  # the only event that creates a job
                return Applied(new_record(event.spec, event.at, seq))
            booked = _book(rec, outcome, event, facts)
            if isinstance(event, ev.JobHeld | ev.JobReleased):
                booked = msgspec.structs.replace(booked, hold_seq=max(rec.hold_seq, seq))
            return Applied(msgspec.structs.replace(booked, last_seq=max(rec.last_seq, seq)))
        case _:
            assert_never(outcome)


def _late_end(rec: LiveJobRecord, event: ev.JobEvent) -> bool:
    """Whether ``event`` ends a job that has not ended, although a later
    event was applied first. ``last_seq`` is a high-water mark: it takes a
    redelivery for a repeat, and JetStream redelivers out of order (a
    message whose handler failed, or whose ack wait passed, comes again
    after later ones). An end event cannot have been applied to a record
    that is not final (applying it makes the record final), so it is not a
    repeat: dropping it would lose an acknowledged cancel."""
    return not rec.final and isinstance(event, ev.JobFinished | ev.JobFailed | ev.JobCancelled)


def _late_hold(rec: LiveJobRecord, event: ev.JobEvent, seq: int) -> bool:
    """Whether ``event`` is a hold or release not yet applied although a
    later event was (redelivered out of order, as :func:`_late_end` says).
    Holds and releases keep their own mark, ``hold_seq``: one at or below
    it is a repeat, or older than the hold or release applied last, which
    it must not undo; one above it is new."""
    return isinstance(event, ev.JobHeld | ev.JobReleased) and seq > rec.hold_seq


def life_of(rec: JobRecord) -> lc.Life:
    """The lifecycle part of a record."""
    return lc.Life(
        phase=rec.phase,
        configuration=rec.configuration,
        restarts=rec.restarts,
        first_start=rec.first_start,
        finished_at=rec.finished_at,
    )


def _with_life(rec: LiveJobRecord, life: lc.Life) -> LiveJobRecord:
    return msgspec.structs.replace(
        rec,
        phase=life.phase,
        configuration=life.configuration,
        restarts=life.restarts,
        first_start=life.first_start,
        finished_at=life.finished_at,
    )


def _decide(rec: LiveJobRecord, decision: lc.Profile | lc.Queue | lc.Retune
            ) -> LiveJobRecord | None:
    """``rec`` after one of the leader's decisions; ``None`` when refused."""
    life = lc.step(life_of(rec), decision)
    return _with_life(rec, life) if isinstance(life, lc.Life) else None


def _book(rec: LiveJobRecord, life: lc.Life, event: ev.JobEvent, facts: Facts) -> LiveJobRecord:
    """The bookkeeping of an accepted event: wait, service, progress, reason."""
    match event:
        case ev.JobProfiled():
            return _profiled(rec, life, event, facts)
        case ev.JobStarted():
            return _started(rec, life, event.at, facts, 0.0)
        case ev.JobResized():
            return _started(rec, life, event.at, facts, event.samples_done or 0.0)
        case ev.JobStopped():
            stopped = max(event.samples_done or 0.0, facts.progress)
            return _ended(rec, life, event.at, facts, stopped, event.reason)
        case ev.JobFinished():
            return _ended(rec, life, event.at, facts, float(rec.spec.total_samples), "")
        case ev.JobFailed():
            return _ended(rec, life, event.at, facts, facts.progress, event.reason)
        case ev.JobCancelled():
            why = event.reason or "cancelled"  # TimeLimit: the leader's (.timelimit)
            return _ended(rec, life, event.at, facts, facts.progress, why)
        case ev.JobHeld():
            why = f"{HELD}: {event.reason}" if event.reason else HELD
            return msgspec.structs.replace(rec, held=True, reason=why)
        case ev.JobReleased():
            return msgspec.structs.replace(rec, held=False,
                                           reason="" if rec.held else rec.reason)
        case ev.JobSubmitted():  # the lifecycle refuses a known job's submission
            raise AssertionError(f"job {rec.job_id} submitted twice")
        case _:
            assert_never(event)


def _profiled(
    rec: LiveJobRecord, life: lc.Life, event: ev.JobProfiled, facts: Facts
) -> LiveJobRecord:
    # The union: job_profiled lists are cumulative, but a profiler replica
    # that restarted may know fewer types than an earlier event named.
    profiled = tuple(sorted(set(rec.profiled) | set(event.gpu_types)))
    rec = _with_life(msgspec.structs.replace(rec, profiled=profiled), life)
    return promote(rec, facts.required, event.at) or rec


def wants_plan(
    before: LiveJobRecord | None, after: LiveJobRecord | None, event: ev.JobEvent
) -> bool:
    """Whether ``event`` calls for a plan within the round: a new job (its
    profiling tasks, §3.2) or a job whose profiles just made it plannable."""
    if isinstance(event, ev.JobSubmitted):
        return not (after or before or new_record(event.spec, 0.0)).final
    if isinstance(event, ev.JobReleased):  # plannable again
        return after is not None and before is not None and before.held and not after.final
    return (
        after is not None
        and after.phase == "queued"
        and before is not None
        and before.phase in PROFILING_PHASES
    )


def promote(rec: LiveJobRecord, required: frozenset[GpuType], now: float) -> LiveJobRecord | None:
    """A job still being profiled whose profiles now cover ``required`` → queued."""
    if not covered(required, rec.profiled):
        return None
    queued = _decide(rec, lc.Queue(job_id=rec.job_id, at=now))
    return None if queued is None else msgspec.structs.replace(queued, since=max(now, rec.since))


def queue_now(rec: LiveJobRecord, now: float) -> LiveJobRecord | None:
    """A job still being profiled → queued without waiting for more profiles
    (a task policy sequences it once it has an estimate on one alive type)."""
    if rec.phase not in PROFILING_PHASES:
        return None
    queued = _decide(rec, lc.Queue(job_id=rec.job_id, at=now))
    return None if queued is None else msgspec.structs.replace(queued, since=max(now, rec.since))


def hold(rec: LiveJobRecord, problem: str | None) -> LiveJobRecord | None:
    """A waiting job that fits no alive GPU type (``problem`` says why) is
    held with the reason ``unschedulable: ...``, and released when it fits
    again (``problem`` None); ``None`` when nothing changes."""
    if rec.phase != "queued" or rec.held:  # a user's hold names its own reason
        return None
    reason = f"{UNSCHEDULABLE}: {problem}" if problem is not None else ""
    if reason == rec.reason or (not reason and not rec.reason.startswith(UNSCHEDULABLE)):
        return None
    return msgspec.structs.replace(rec, reason=reason)


def hold_tenant(rec: LiveJobRecord, problem: str | None) -> LiveJobRecord | None:
    """A waiting job (any phase before running) whose tenant the tenants
    file does not name (``problem`` says so) is held with the reason
    ``unknown_tenant: ...``, and released when a reload names it again
    (``problem`` None); ``None`` when nothing changes. A running job keeps
    running, and a user's hold keeps its own reason."""
    if rec.final or rec.phase == "running" or rec.held:
        return None
    reason = f"{UNKNOWN_TENANT}: {problem}" if problem is not None else ""
    if reason == rec.reason or (not reason and not rec.reason.startswith(UNKNOWN_TENANT)):
        return None
    return msgspec.structs.replace(rec, reason=reason)


def retune(rec: LiveJobRecord, config: Configuration | None) -> LiveJobRecord | None:
    """A running job whose placement (``hops_alloc``, ``config``) the placer
    changed in place, the same GPUs with other cores (``set_cores``, no job
    event): its record follows, so that clients see the cores it holds.
    ``None`` when nothing changes, or the placement is not such a change."""
    current = rec.configuration
    if config is None or rec.phase != "running" or current is None or current == config:
        return None
    if current.parts != config.parts:
        return None  # a move: job_resized says so
    return _decide(rec, lc.Retune(job_id=rec.job_id, configuration=config))


def with_progress(rec: LiveJobRecord, progress: float) -> LiveJobRecord | None:
    """A running job's record with the progress its heartbeats reported
    (``None`` when that is not more than the record has)."""
    done = min(float(rec.spec.total_samples), progress)
    if rec.phase != "running" or done <= rec.samples_done:
        return None
    return msgspec.structs.replace(rec, samples_done=done)


def back_to_profiling(
    rec: LiveJobRecord, types: frozenset[GpuType], now: float
) -> LiveJobRecord | None:
    """A waiting job that lacks a profile on ``types`` (it joined the queue
    while they were busy, or they are new) → ``profiling``; its wait so far
    is kept. ``None`` when it is not waiting or ``types`` is empty."""
    if rec.phase != "queued" or not types:
        return None
    back = _decide(rec, lc.Profile(job_id=rec.job_id, at=now))
    assert back is not None  # the lifecycle sends a queued job back to profiling
    waited = max(0.0, now - rec.since)
    return msgspec.structs.replace(back, wait_s=rec.wait_s + waited, since=max(now, rec.since))


def mark_profiling(rec: LiveJobRecord) -> LiveJobRecord | None:
    """A submitted job that a plan sends to profiling → ``profiling``."""
    return _decide(rec, lc.Profile(job_id=rec.job_id)) if rec.phase == "submitted" else None


def _started(
    rec: LiveJobRecord, life: lc.Life, at: float, facts: Facts, resumed: float
) -> LiveJobRecord:
    closed = close_phase(rec, at, facts)
    return msgspec.structs.replace(
        _with_life(closed, life),
        reason="",  # why it waited is over
        samples_done=min(
            float(rec.spec.total_samples), max(rec.samples_done, facts.progress, resumed)
        ),
    )


def _ended(
    rec: LiveJobRecord, life: lc.Life, at: float, facts: Facts, samples: float, reason: str
) -> LiveJobRecord:
    closed = close_phase(rec, at, facts)
    return msgspec.structs.replace(
        _with_life(closed, life),
        samples_done=min(float(rec.spec.total_samples), max(rec.samples_done, samples)),
        reason=reason,
    )


def counts_progress(beat: ev.JobHeartbeat, subject_ids: tuple[str, str],
                    placed: Configuration | None) -> bool:
    """Whether ``beat`` may move its job's progress: it names the server and job
    of its subject (``hops.v1.jobs.heartbeat.<sid>.<job>``, which NATS ties to
    the executor's identity) and, where the job's placement is known, a server
    of it. The monitor audits the rest (docs/security.md)."""
    sid, job = subject_ids
    if (beat.job_id, beat.server_id) != (job, sid):
        return False
    return placed is None or ServerId(sid) in placed.servers
