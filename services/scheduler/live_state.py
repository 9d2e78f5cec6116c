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
- ``last_seq``: the ``HOPS_JOBS`` stream sequence of the last event applied,
  so that a redelivered event changes nothing.

Phases: ``submitted`` → ``profiling`` (a plan carries profiling tasks for it,
§3.2) → ``queued`` (``job_profiled`` covers every GPU type of the alive
nodes) → ``running`` (``job_started``) → ``queued`` (``job_stopped``) ... →
``finished`` / ``failed`` / ``cancelled``, which are final. ``samples_done``
is the largest progress heard of: ``job_heartbeat`` (kept by the shell and
passed in as :attr:`Facts.progress`), the ``samples_done`` of ``job_stopped``
and ``job_resized`` (where the placer knows it) and ``total_samples`` on
``job_finished``.
``restarts`` counts the checkpoint-restarts: every start after the first and
every resize. A ``job_started`` or ``job_stopped`` while the job is still
being profiled belongs to a profiling run and changes no phase.

``reason`` says why a job waits or ended (a stop's reason, a failure's) and
is cleared when it starts. A queued job that fits no GPU type of the alive
nodes is *held*: reason ``unschedulable: ...``, in no plan, until capacity
returns (:func:`hold`). While a job runs, the leader writes the progress its
heartbeats report into ``samples_done`` (:func:`with_progress`), so what a
client reads is current.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import msgspec

from shared import events as ev
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import JobPhase, JobRecord
from shared.wire import UNSCHEDULABLE  # also the reason of a job held out of every plan

PROFILING_PHASES: frozenset[str] = frozenset({"submitted", "profiling"})


class LiveJobRecord(JobRecord, frozen=True, kw_only=True):
    """``hops_jobs[job_id]`` as the scheduler writes it; see the module docstring."""

    wait_s: float = 0.0
    since: float = 0.0
    attained_gpu_s: float = 0.0
    run_s_by_type: dict[GpuType, float] = msgspec.field(default_factory=dict)
    last_seq: int = 0


_DECODER = msgspec.json.Decoder(LiveJobRecord)


def encode_record(record: JobRecord) -> bytes:
    return msgspec.json.encode(record)


def decode_record(data: bytes) -> LiveJobRecord:
    """A record from KV (raises ``msgspec.DecodeError`` on bytes that are not one)."""
    return _DECODER.decode(data)


def new_record(spec: JobSpec, at: float, seq: int = 0) -> LiveJobRecord:
    return LiveJobRecord(spec=spec, submitted_at=at, since=at, last_seq=seq)


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
    for sid, gpus in rec.configuration.parts:
        gpu_type = facts.server_types.get(sid, GpuType("unknown"))
        by_type[gpu_type] = by_type.get(gpu_type, 0.0) + held * gpus
    for gpu_type in {
        facts.server_types.get(s, GpuType("unknown")) for s in rec.configuration.servers
    }:
        run_s[gpu_type] = run_s.get(gpu_type, 0.0) + held
    return msgspec.structs.replace(
        rec,
        attained_by_type=by_type,
        run_s_by_type=run_s,
        attained_gpu_s=rec.attained_gpu_s + held * rec.configuration.total_gpus,
        since=max(at, rec.since),
    )


def apply_event(rec: LiveJobRecord | None, event: ev.JobEvent, seq: int, facts: Facts) -> Applied:
    """The record after ``event`` (stream sequence ``seq``); see the module docstring."""
    if isinstance(event, ev.JobSubmitted):
        if rec is None:
            return Applied(new_record(event.spec, event.at, seq))
        if seq <= rec.last_seq:
            return Applied(None, "already applied")
        return Applied(msgspec.structs.replace(rec, last_seq=seq))
    if rec is None:
        return Applied(None, "unknown job")
    if seq <= rec.last_seq:
        return Applied(None, "already applied")
    if rec.final:
        return Applied(msgspec.structs.replace(rec, last_seq=seq), f"job is {rec.phase}")
    new = _transition(rec, event, facts)
    if new is None:
        return Applied(msgspec.structs.replace(rec, last_seq=seq), "profiling run")
    return Applied(msgspec.structs.replace(new, last_seq=seq))


def _transition(rec: LiveJobRecord, event: ev.JobEvent, facts: Facts) -> LiveJobRecord | None:
    at = event.at
    profiling = rec.phase in PROFILING_PHASES
    if isinstance(event, ev.JobProfiled):
        return _profiled(rec, event, facts)
    if isinstance(event, ev.JobStarted | ev.JobResized):
        if profiling:
            return None
        resized = isinstance(event, ev.JobResized)
        resumed = (event.samples_done or 0.0) if isinstance(event, ev.JobResized) else 0.0
        return _started(rec, event.configuration, at, facts, resized, resumed)
    if isinstance(event, ev.JobStopped):
        if profiling:
            return None
        stopped = max(event.samples_done or 0.0, facts.progress)
        return _ended(rec, "queued", at, facts, stopped, event.reason)
    if isinstance(event, ev.JobFinished):
        return _ended(rec, "finished", at, facts, float(rec.spec.total_samples), "")
    if isinstance(event, ev.JobFailed):
        return _ended(rec, "failed", at, facts, facts.progress, event.reason)
    return _ended(rec, "cancelled", at, facts, facts.progress, "cancelled")


def _profiled(rec: LiveJobRecord, event: ev.JobProfiled, facts: Facts) -> LiveJobRecord:
    # The union: job_profiled lists are cumulative, but a profiler replica
    # that restarted may know fewer types than an earlier event named.
    profiled = tuple(sorted(set(rec.profiled) | set(event.gpu_types)))
    rec = msgspec.structs.replace(rec, profiled=profiled)
    if rec.phase in PROFILING_PHASES:
        return promote(rec, facts.required, event.at) or _set_phase(rec, "profiling")
    return rec


def wants_plan(
    before: LiveJobRecord | None, after: LiveJobRecord | None, event: ev.JobEvent
) -> bool:
    """Whether ``event`` calls for a plan within the round: a new job (its
    profiling tasks, §3.2) or a job whose profiles just made it plannable."""
    if isinstance(event, ev.JobSubmitted):
        return not (after or before or new_record(event.spec, 0.0)).final
    return (
        after is not None
        and after.phase == "queued"
        and before is not None
        and before.phase in PROFILING_PHASES
    )


def promote(rec: LiveJobRecord, required: frozenset[GpuType], now: float) -> LiveJobRecord | None:
    """A job still being profiled whose profiles now cover ``required`` → queued."""
    if rec.phase not in PROFILING_PHASES or not covered(required, rec.profiled):
        return None
    return msgspec.structs.replace(rec, phase="queued", since=max(now, rec.since))


def hold(rec: LiveJobRecord, problem: str | None) -> LiveJobRecord | None:
    """A waiting job that fits no alive GPU type (``problem`` says why) is
    held with the reason ``unschedulable: ...``, and released when it fits
    again (``problem`` None); ``None`` when nothing changes."""
    if rec.phase != "queued":
        return None
    reason = f"{UNSCHEDULABLE}: {problem}" if problem is not None else ""
    if reason == rec.reason or (not reason and not rec.reason.startswith(UNSCHEDULABLE)):
        return None
    return msgspec.structs.replace(rec, reason=reason)


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
    waited = max(0.0, now - rec.since)
    return msgspec.structs.replace(
        rec, phase="profiling", wait_s=rec.wait_s + waited, since=max(now, rec.since)
    )


def mark_profiling(rec: LiveJobRecord) -> LiveJobRecord | None:
    """A submitted job that a plan sends to profiling → ``profiling``."""
    return _set_phase(rec, "profiling") if rec.phase == "submitted" else None


def _set_phase(rec: LiveJobRecord, phase: JobPhase) -> LiveJobRecord:
    return rec if rec.phase == phase else msgspec.structs.replace(rec, phase=phase)


def _started(
    rec: LiveJobRecord,
    config: Configuration,
    at: float,
    facts: Facts,
    resized: bool,
    resumed: float,
) -> LiveJobRecord:
    closed = close_phase(rec, at, facts)
    first = rec.first_start is None
    return msgspec.structs.replace(
        closed,
        phase="running",
        configuration=config,
        first_start=at if first else rec.first_start,
        restarts=rec.restarts + (1 if resized or not first else 0),
        reason="",  # why it waited is over
        samples_done=min(
            float(rec.spec.total_samples), max(rec.samples_done, facts.progress, resumed)
        ),
    )


def _ended(
    rec: LiveJobRecord, phase: JobPhase, at: float, facts: Facts, samples: float, reason: str
) -> LiveJobRecord:
    closed = close_phase(rec, at, facts)
    final = phase != "queued"
    return msgspec.structs.replace(
        closed,
        phase=phase,
        configuration=None,
        samples_done=min(float(rec.spec.total_samples), max(rec.samples_done, samples)),
        finished_at=at if final else None,
        reason=reason,
    )
