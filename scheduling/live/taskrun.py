"""The leader's task loop, pure (docs/hare.md §7 "Live mechanism"): the
snapshot it builds, the reports it counts, when it replans and which job
events follow, for a live task policy (``hare``, ``hare-eft`` or a baseline
of ``hops experiment hare``). The service shell is
:mod:`services.scheduler.tasks`; the sequences core is
:mod:`scheduling.live.tasks`.

The snapshot (:func:`task_snapshot`)
------------------------------------
Every arrived, unfinished GPU job that is not held, as a
:class:`~scheduling.policies.hare.model.TaskJob` (:func:`task_job`):

* ``tasks_per_round`` = S (``JobSpec.sync_scale``), ``rounds`` =
  ceil(total_samples / (S · batch_size)): a round is one step of the
  global batch of S micro-batches;
* ``done_rounds``: the rounds applied (see counting below);
* T^c on type t (hare.md Table 1, one micro-batch) = batch_size /
  per-GPU throughput on one GPU of t (the estimator's ``agg[0]``, samples/s);
* T^s on type t = batch_size / (per-GPU throughput on t with two GPUs:
  ``agg[1]`` on one server, else ``dist[0]`` over two nodes) − T^c, at
  least 0: what a synchronised step costs a GPU beyond its compute (0 where
  the estimator has neither figure);
* arrival: the job's submission; weight 1 (a JobSpec has none);
* the estimates are in the jobs' time, the plan on the wall clock the
  executors wait on: T^c and T^s are divided by the time scale
  (``HOPS_TASK_TIME_SCALE``, the emulated executors' ``--time-scale``;
  1 for real jobs), as the executors divide the world model's times.

A job that cannot be sequenced waits with a reason and a stable code:
``not_relaxed`` (S = 0: a task policy sequences relaxed-sync jobs only) or
``no_estimate`` (no estimator throughput on any alive GPU type yet: the job
needs a profile, its own or its signature's shared one).

Counting reports (:class:`Progress`)
------------------------------------
A ``task_done`` is checked against the leader's revision
(:func:`scheduling.live.tasks.done_problem`) and against its subject (the
server and job NATS ties to the executor's identity). A report of an entry
already counted, or of a round already applied, is counted once.

When a round is *applied* (the job's ``done_rounds`` grows, in round
order) depends on the job (:func:`aggregated`):

* a job with a command (a real job, trained by resident trainers): when
  its aggregator says so (``round_applied`` on ``HOPS_AGG_APPLIED``,
  :meth:`Progress.round_applied`): the update is applied to the model,
  and after the last round its final parameters are saved (the aggregator
  saves them before it publishes that round). ``task_done`` reports only
  mark entries done. The messages may come in any order and twice: a
  round applied means every round before it is too;
* an emulated job (no command, no model, no aggregator): when all S
  micro-batches of the round are reported done.

Replanning (:func:`replan_reasons`)
-----------------------------------
On an arrival or a job's end (the set of sequenced jobs changes), a change
of the GPUs, a round applied (it frees a place in the job's horizon and
rounds may have ended earlier or later than planned), and at a new term's
first pass. Not on every report: an entry done ahead of its round's end
changes nothing a replan could use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal, NamedTuple

import msgspec

from scheduling.live.state import LiveJobRecord
from scheduling.live.tasks import TaskSnapshot, done_key, done_problem, gpu_id, split_gpu_id
from scheduling.policies.hare.model import Gpu, GpuId, TaskJob
from scheduling.policies.hare.sequences import EntryKey, Sequences
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.events import TaskDone
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.wire import NO_ESTIMATE, NOT_RELAXED

TASK_STATE = "tasks"  # its object in hops_state


class DoneEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An entry reported done: micro-batches ``lo .. hi - 1`` of ``round``
    of ``job`` on ``gpu``."""

    job: JobId
    round: int
    lo: int
    hi: int
    gpu: GpuId

    @property
    def key(self) -> EntryKey:
        return (self.job, self.round, self.lo)


class TaskState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a new leader resumes from (object ``tasks`` in ``hops_state``):
    the last revision (None: none yet), the entries reported done of rounds
    not yet applied, each job's applied rounds, the last ``HOPS_TASK_DONE``
    stream sequence counted, and the jobs whose ``job_started`` and
    ``job_finished`` were published."""

    seqs: Sequences | None = None
    done: tuple[DoneEntry, ...] = ()
    applied: dict[JobId, int] = {}
    stream_seq: int = 0
    started: tuple[JobId, ...] = ()
    finished: tuple[JobId, ...] = ()
    term: int = 0  # the term that wrote it
    agg_seq: int = 0  # the last HOPS_AGG_APPLIED stream sequence counted


def encode_state(state: TaskState) -> bytes:
    return msgspec.json.encode(state)


def decode_state(data: bytes) -> TaskState:
    """``msgspec.DecodeError`` on bytes that are not a task state."""
    return msgspec.json.decode(data, type=TaskState)


Outcome = Literal["refused", "duplicate", "counted", "applied"]


class Counted(NamedTuple):
    """What one report did: ``applied`` rounds newly applied of its job;
    ``reason`` why it was refused or not counted again."""

    outcome: Outcome
    reason: str = ""
    applied: int = 0


class Progress:
    """The leader's task progress (module docstring); mutable, one term's."""

    def __init__(self, state: TaskState) -> None:
        self.seqs = state.seqs
        self.done: dict[EntryKey, DoneEntry] = {d.key: d for d in state.done}
        self.applied: dict[JobId, int] = dict(state.applied)
        self.stream_seq = state.stream_seq
        self.started: set[JobId] = set(state.started)
        self.finished: set[JobId] = set(state.finished)
        self.agg_seq = state.agg_seq

    def state(self, term: int) -> TaskState:
        return TaskState(self.seqs, tuple(sorted(self.done.values(), key=lambda d: d.key)),
                         dict(sorted(self.applied.items())), self.stream_seq,
                         tuple(sorted(self.started)), tuple(sorted(self.finished)), term,
                         self.agg_seq)

    def done_keys(self) -> frozenset[EntryKey]:
        """The entries done: those reported, and every entry of the revision
        in a round already applied (their reports are no longer kept)."""
        applied = frozenset() if self.seqs is None else frozenset(
            e.key for _, e in self.seqs.entries() if e.round < self.applied.get(e.job, 0))
        return frozenset(self.done) | applied

    def count(self, msg: TaskDone, subject_ids: tuple[str, str], seq: int = 0,
              aggregated: bool = False) -> Counted:
        """Count ``msg``, stream sequence ``seq`` (0: not from the stream),
        sent on the subject of ``subject_ids`` = (server, job); its job's
        rounds are applied by its aggregator when ``aggregated`` (then the
        report marks its entry done, nothing more)."""
        if seq:
            if seq <= self.stream_seq:
                return Counted("duplicate", f"stream sequence {seq} was counted already")
            self.stream_seq = seq
        why = self._problem(msg, subject_ids)
        if why is not None:
            return Counted("refused", why)
        key = done_key(msg)
        if key in self.done:
            return Counted("duplicate", f"entry {key} was counted already")
        if msg.round < self.applied.get(msg.job_id, 0):
            return Counted("duplicate", f"round {msg.round} of {msg.job_id} is applied already")
        self.done[key] = DoneEntry(msg.job_id, msg.round, msg.lo, msg.hi,
                                   gpu_id(msg.server_id, msg.gpu_index))
        applied = 0 if aggregated else self._apply(msg.job_id)
        return Counted("applied", applied=applied) if applied else Counted("counted")

    def round_applied(self, job: JobId, round_: int, seq: int = 0) -> Counted:
        """Job ``job``'s aggregator applied round ``round_`` (stream sequence
        ``seq``, 0: not from the stream): ``round_`` + 1 rounds in all."""
        if seq:
            if seq <= self.agg_seq:
                return Counted("duplicate", f"stream sequence {seq} was counted already")
            self.agg_seq = seq
        if round_ < 0:
            return Counted("refused", f"round {round_} of {job} is no round")
        first = self.applied.get(job, 0)
        if round_ < first:
            return Counted("duplicate", f"round {round_} of {job} is applied already")
        self.applied[job] = round_ + 1
        self._drop_done(job, round_ + 1)
        return Counted("applied", applied=round_ + 1 - first)

    def _drop_done(self, job: JobId, applied: int) -> None:
        """Forget the reports of ``job``'s rounds before ``applied``."""
        for key in [k for k in self.done if k[0] == job and k[1] < applied]:
            del self.done[key]

    def _problem(self, msg: TaskDone, subject_ids: tuple[str, str]) -> str | None:
        """Why ``msg`` is refused; None when it may count (or counted already:
        a report of an entry counted on the same GPU, or of a round applied,
        which the revision may no longer hold)."""
        sid, job = subject_ids
        if (msg.server_id, msg.job_id) != (sid, job):
            return (f"report names server {msg.server_id} and job {msg.job_id}, "
                    f"its subject server {sid} and job {job}")
        counted = self.done.get(done_key(msg))
        if counted is not None and counted.gpu == gpu_id(msg.server_id, msg.gpu_index) \
                and counted.hi == msg.hi:
            return None
        if self.seqs is None:
            return "no sequence was sent yet"
        why = done_problem(self.seqs, msg)
        if why is not None and msg.round < self.applied.get(msg.job_id, 0):
            return None  # its round is applied: counted already, and dropped since
        return why

    def _apply(self, job: JobId) -> int:
        """Apply the job's complete rounds, in order; how many."""
        assert self.seqs is not None
        by_round: dict[int, list[EntryKey]] = {}
        for _, e in self.seqs.entries():
            if e.job == job:
                by_round.setdefault(e.round, []).append(e.key)
        first = self.applied.get(job, 0)
        nxt = first
        while by_round.get(nxt) and all(k in self.done for k in by_round[nxt]):
            nxt += 1
        if nxt > first:
            self.applied[job] = nxt
            self._drop_done(job, nxt)
        return nxt - first

    def forget_jobs(self, keep: Iterable[JobId]) -> None:
        """Drop the progress of jobs not in ``keep`` (they ended)."""
        alive = set(keep)
        self.applied = {j: r for j, r in self.applied.items() if j in alive}
        self.done = {k: d for k, d in self.done.items() if k[0] in alive}
        self.started &= alive
        self.finished &= alive


def aggregated(spec: JobSpec) -> bool:
    """Whether ``spec``'s rounds are applied by its aggregator (a job with a
    command: real training) rather than counted from ``task_done``s."""
    return bool(spec.command)


# --- the snapshot --------------------------------------------------------------------


def rounds_of(total_samples: int, sync_scale: int, batch_size: int) -> int:
    """A relaxed job's rounds: steps of S micro-batches of ``batch_size``."""
    return max(1, math.ceil(total_samples / (sync_scale * batch_size)))


def task_times(est: JobEstimate, batch_size: int, types: Iterable[GpuType],
               time_scale: float = 1.0) -> tuple[dict[GpuType, float], dict[GpuType, float]]:
    """(T^c, T^s) per type of ``types`` the estimate covers (module
    docstring), in wall seconds: the estimate's seconds of the jobs' time
    over ``time_scale``, the executors' jobs' seconds per wall second."""
    compute: dict[GpuType, float] = {}
    sync: dict[GpuType, float] = {}
    for t in sorted(set(types)):
        curve = est.by_type.get(t)
        one = curve.agg_per_gpu(1) if curve is not None and curve.agg else 0.0
        if curve is None or not (math.isfinite(one) and one > 0):
            continue
        step = batch_size / one
        # the smallest placement that synchronises: two GPUs of one server,
        # else one GPU on each of two nodes
        two = curve.agg[1] if len(curve.agg) > 1 else curve.dist_per_gpu(2)
        compute[t] = step / time_scale
        sync[t] = max(0.0, batch_size / two - step) / time_scale if two > 0 else 0.0
    return compute, sync


def task_job(rec: LiveJobRecord, est: JobEstimate | None, types: Iterable[GpuType],
             applied: int, time_scale: float = 1.0) -> TaskJob | str:
    """``rec``'s job as the task policy sees it, or why it waits (``code:
    words``); its times in wall seconds (:func:`task_times`)."""
    spec = rec.spec
    if spec.sync_scale < 1:
        return (f"{NOT_RELAXED}: a task policy sequences relaxed-sync jobs only (sync_scale "
                "S > 0); this job has none")
    compute, sync = task_times(est, spec.batch_size, types, time_scale) if est else ({}, {})
    if not compute:
        return (f"{NO_ESTIMATE}: no throughput estimate on an alive GPU type yet (the job "
                "needs a profile)")
    rounds = rounds_of(spec.total_samples, spec.sync_scale, spec.batch_size)
    return TaskJob(id=spec.id, arrival_s=rec.submitted_at, rounds=rounds,
                   tasks_per_round=spec.sync_scale, compute_s=compute, sync_s=sync,
                   model=spec.model, done_rounds=min(applied, rounds))


def gpus_of(nodes: Iterable[NodeRecord]) -> tuple[Gpu, ...]:
    """The alive servers' GPUs, by server id then index."""
    return tuple(Gpu(gpu_id(n.server.id, i), n.server.gpu_type)
                 for n in sorted(nodes, key=lambda n: n.server.id) if n.alive
                 for i in range(n.server.gpus))


def candidates(records: Mapping[JobId, LiveJobRecord]) -> list[LiveJobRecord]:
    """The jobs a task snapshot considers: GPU jobs not ended and not held."""
    return [r for _, r in sorted(records.items())
            if not r.final and r.spec.kind == "gpu" and not r.held]


def task_snapshot(now: float, records: Mapping[JobId, LiveJobRecord],
                  estimates: Mapping[JobId, JobEstimate], nodes: Iterable[NodeRecord],
                  progress: Progress, time_scale: float = 1.0
                  ) -> tuple[TaskSnapshot, dict[JobId, str]]:
    """The snapshot (module docstring) and each waiting job's reason. A job
    whose rounds are all applied is left out (it ends). The times are wall
    seconds: ``time_scale`` as :func:`task_times`."""
    gpus = gpus_of(nodes)
    types = {g.type for g in gpus}
    jobs: list[TaskJob] = []
    waits: dict[JobId, str] = {}
    for rec in candidates(records):
        job = task_job(rec, estimates.get(rec.job_id), types, progress.applied.get(rec.job_id, 0),
                       time_scale)
        if isinstance(job, str):
            waits[rec.job_id] = job
        elif job.done_rounds < job.rounds:
            jobs.append(job)
    return TaskSnapshot(now, tuple(jobs), gpus, progress.done_keys()), waits


# --- triggers and job events --------------------------------------------------------


def sequenced_jobs(seqs: Sequences | None) -> frozenset[JobId]:
    return frozenset() if seqs is None else frozenset(e.job for _, e in seqs.entries())


def replan_reasons(seqs: Sequences | None, snap: TaskSnapshot, rounds_applied: bool,
                   new_term: bool) -> list[str]:
    """Why the leader replans now (none: it does not); module docstring."""
    jobs = frozenset(j.id for j in snap.jobs)
    if seqs is None:
        return ["first revision"] if jobs and snap.gpus else []
    out = []
    if new_term:
        out.append("new term")
    if jobs != sequenced_jobs(seqs):
        out.append("jobs changed")
    if frozenset(g.id for g in snap.gpus) != frozenset(seqs.gpus):
        out.append("GPUs changed")
    if rounds_applied:
        out.append("round applied")
    return out if snap.gpus else []


def placements(seqs: Sequences) -> dict[JobId, Configuration]:
    """Each sequenced job's GPUs: per server, how many of its GPUs hold an
    entry of the job (the placement its ``job_started`` names)."""
    held: dict[JobId, dict[ServerId, set[int]]] = {}
    for gpu, e in seqs.entries():
        server, index = split_gpu_id(gpu)
        held.setdefault(e.job, {}).setdefault(server, set()).add(index)
    return {job: Configuration.of({s: len(i) for s, i in by.items()})
            for job, by in held.items()}


def to_start(seqs: Sequences | None, records: Mapping[JobId, LiveJobRecord],
             started: Iterable[JobId]) -> dict[JobId, Configuration]:
    """The jobs whose first entry is sequenced and whose ``job_started`` is
    not out yet, with their placements: queued jobs only (a running record
    has had one; a job still in profiling is queued by the next pass)."""
    if seqs is None:
        return {}
    done = set(started)
    return {j: c for j, c in sorted(placements(seqs).items())
            if j not in done and j in records and records[j].phase == "queued"}


def to_finish(snap_records: Mapping[JobId, LiveJobRecord], progress: Progress
              ) -> list[JobId]:
    """The jobs whose last round is applied and whose ``job_finished`` is not out yet."""
    out = []
    for rec in candidates(snap_records):
        spec = rec.spec
        if spec.sync_scale < 1 or rec.job_id in progress.finished:
            continue
        if progress.applied.get(rec.job_id, 0) >= rounds_of(spec.total_samples,
                                                            spec.sync_scale, spec.batch_size):
            out.append(rec.job_id)
    return out


def samples_applied(rec: LiveJobRecord, applied: int) -> float:
    """The samples of ``applied`` rounds (the record's progress)."""
    spec = rec.spec
    return float(min(spec.total_samples, applied * spec.sync_scale * spec.batch_size))


def wait_reason(rec: LiveJobRecord, reason: str | None) -> LiveJobRecord | None:
    """A waiting job's record with the task loop's ``reason`` (None: it no
    longer waits for one of the task loop's reasons); ``None`` when nothing
    changes. A running, ended or user-held job keeps its own reason."""
    if rec.final or rec.phase == "running" or rec.held:
        return None
    mine = rec.reason.startswith((NOT_RELAXED, NO_ESTIMATE))
    new = reason if reason is not None else ("" if mine else rec.reason)
    return None if new == rec.reason else msgspec.structs.replace(rec, reason=new)
