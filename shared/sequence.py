"""The parts of Hare's task sequences that travel (``task_sequence`` and
``task_done`` in :mod:`shared.events`), and the checks their messages run
on themselves, so that a malformed or forged one is refused as it is
decoded, with a reason in words (docs/events.md, docs/hare.md "Live
mechanism").

A :class:`TaskEntry` is micro-batches ``lo .. hi - 1`` of round ``round``
of a relaxed-sync job (its S micro-batches per round, :mod:`shared.relaxed`),
planned on one GPU over ``[start_s, end_s)`` of the leader's clock;
``hold``: not before ``start_s`` (the policy's decision to start the job).
A server's GPUs each run their entries in order, one at a time.

A :class:`RoundsApplied` says how many rounds of a job its aggregator has
applied as the leader counts them: a server starts an entry of round r of
a listed job only once r rounds are applied (the round barrier across
servers); a job not listed is not held.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from shared.ids import JobId
from shared.job import JobSpec
from shared.subjects import SubjectError, check_token

# Planned times are sums of floats made on the leader; a tolerance this small
# tells their rounding from an overlap.
TOLERANCE_S = 1e-9


class TaskEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of a GPU's sequence (module docstring)."""

    job_id: JobId
    round: int
    lo: int
    hi: int
    start_s: float
    end_s: float
    hold: bool = False


class GpuTasks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """GPU ``gpu_index`` of the server: its entries, in the order it runs them."""

    gpu_index: int
    entries: tuple[TaskEntry, ...] = ()


class RoundsApplied(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Rounds ``0 .. rounds - 1`` of ``job_id`` are applied (module docstring)."""

    job_id: JobId
    rounds: int


def applied_problem(applied: Sequence[RoundsApplied]) -> str | None:
    """Why these counts cannot be a sequence's; None when they can: one per
    job, each a valid job id with ``rounds`` >= 0."""
    jobs = [a.job_id for a in applied]
    if len(set(jobs)) != len(jobs):
        return "a job has two counts of rounds applied"
    for a in applied:
        if (why := _token_problem(a.job_id, "job id")) is not None:
            return why
        if a.rounds < 0:
            return f"job {a.job_id}: {a.rounds} rounds applied (need >= 0)"
    return None


def _token_problem(value: str, what: str) -> str | None:
    try:
        check_token(value, what)
    except SubjectError as e:
        return str(e)
    return None


def span_problem(job_id: str, round_: int, lo: int, hi: int) -> str | None:
    """Why micro-batches ``lo .. hi - 1`` of round ``round_`` of ``job_id``
    cannot be a task; None when they can."""
    if (why := _token_problem(job_id, "job id")) is not None:
        return why
    if round_ < 0:
        return f"job {job_id}: round {round_} < 0"
    if not 0 <= lo < hi:
        return f"job {job_id} round {round_}: micro-batches {lo}..{hi - 1} (need 0 <= lo < hi)"
    return None


def times_problem(what: str, start: float, end: float) -> str | None:
    """Why ``[start, end)`` cannot be a task's time; None when it can."""
    if not (math.isfinite(start) and math.isfinite(end)):
        return f"{what}: times must be finite, got {start}..{end}"
    if end < start:
        return f"{what}: ends at {end}, before it starts at {start}"
    return None


def _gpu_problem(gpu: GpuTasks, seen: dict[tuple[JobId, int], set[int]]) -> str | None:
    last_round: dict[JobId, int] = {}
    prev: TaskEntry | None = None
    for e in gpu.entries:
        where = f"GPU {gpu.gpu_index}, job {e.job_id} round {e.round}"
        why = span_problem(e.job_id, e.round, e.lo, e.hi) or times_problem(where, e.start_s,
                                                                          e.end_s)
        if why is not None:
            return why
        if prev is not None and e.start_s < prev.end_s - TOLERANCE_S:
            return (f"{where} starts at {e.start_s}, before the entry before it ends at "
                    f"{prev.end_s}: entries of a GPU run one at a time, in order")
        if e.round < last_round.get(e.job_id, e.round):
            return (f"{where} comes after round {last_round[e.job_id]} of the job: a round "
                    "cannot wait on a later one")
        taken = seen.setdefault((e.job_id, e.round), set())
        twice = taken.intersection(range(e.lo, e.hi))
        if twice:
            return f"{where}: micro-batches {sorted(twice)} are assigned twice"
        taken.update(range(e.lo, e.hi))
        last_round[e.job_id] = e.round
        prev = e
    return None


def sequence_problem(gpus: Sequence[GpuTasks]) -> str | None:
    """Why these sequences of one server cannot be run; None when they can:
    GPU indices distinct and >= 0; every entry a valid task; on each GPU no
    entry starting before the one before it ends, and a job's rounds in
    order; no micro-batch of a round on two entries."""
    indices = [g.gpu_index for g in gpus]
    if len(set(indices)) != len(indices) or any(i < 0 for i in indices):
        return f"gpu indices {indices} must be distinct and >= 0"
    seen: dict[tuple[JobId, int], set[int]] = {}
    for gpu in gpus:
        if (why := _gpu_problem(gpu, seen)) is not None:
            return why
    return None


def specs_problem(gpus: Sequence[GpuTasks], specs: Sequence[JobSpec]) -> str | None:
    """Why ``specs`` cannot go with these sequences; None when they can: one
    spec per job, every job with an entry has its spec, a relaxed-sync one
    (S > 0), and no entry names a micro-batch at or past its S."""
    by_id = {spec.id: spec for spec in specs}
    if len(by_id) != len(specs):
        return "a job has two specs"
    for gpu in gpus:
        for e in gpu.entries:
            spec = by_id.get(e.job_id)
            if spec is None:
                return f"job {e.job_id} has entries but no spec"
            if spec.sync_scale < 1:
                return f"job {e.job_id} is not relaxed-sync (sync_scale 0): it has no tasks"
            if e.hi > spec.sync_scale:
                return (f"job {e.job_id} round {e.round}: micro-batches {e.lo}..{e.hi - 1}, "
                        f"but the job has S = {spec.sync_scale} per round")
    return None


TaskKey = tuple[JobId, int, int]  # (job, round, first micro-batch): an entry's identity


def follow_problem(lease_term: int, held: tuple[int, int] | None, term: int, revision: int,
                   gpus: Sequence[GpuTasks], running: Mapping[int, TaskKey],
                   done: Mapping[TaskKey, int]) -> str | None:
    """Why a server must not take revision ``revision`` of term ``term``
    (``gpus``: its sequences), holding revision ``held`` = (term, revision)
    (None: none yet), running ``running`` (GPU index → the entry it runs)
    and having done ``done`` (entry → the GPU index it ran on); None when
    it may. Refused: a term that is not the leader lease's (a deposed or
    forged leader), a revision not newer than the one held, and a sequence
    that moves a started entry (a running entry not first among the GPU's
    entries not done, or a done one on another GPU)."""
    if term != lease_term:
        return f"term {term} is not the leader lease's term {lease_term}"
    if held is not None and (term, revision) <= held:
        return f"revision {revision} of term {term} is not newer than {held[1]} of term {held[0]}"
    where = {(e.job_id, e.round, e.lo): g.gpu_index for g in gpus for e in g.entries}
    for key, index in done.items():
        if key in where and where[key] != index:
            return f"entry {key} ran on GPU {index}; the sequence moves it to GPU {where[key]}"
    by_index = {g.gpu_index: g.entries for g in gpus}
    for index, now in running.items():
        head = next(((e.job_id, e.round, e.lo) for e in by_index.get(index, ())
                     if (e.job_id, e.round, e.lo) not in done), None)
        if head != now:
            return (f"GPU {index} runs entry {now}; the sequence puts "
                    f"{head if head is not None else 'nothing'} first")
    return None
