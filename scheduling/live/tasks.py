"""Live task sequences: what the leader asks of the sequences core
(:mod:`scheduling.policies.hare.sequences`) when the live policy is a task
policy (``hare``, ``hare-eft`` or a baseline of ``hops experiment hare``).

Pure: the caller passes the time (``TaskSnapshot.now``) and what the
servers reported; nothing here reads a clock or the bus.

The snapshot
------------
A :class:`TaskSnapshot` has the arrived, unfinished relaxed jobs as
:class:`~scheduling.policies.hare.model.TaskJob` (``done_rounds``: the
rounds whose S micro-batches the job's aggregator has applied; T^c and T^s
per GPU type from the estimates), the GPUs (id ``<server>:<index>``,
:func:`gpu_id`) and the entries the servers reported done (``task_done``:
computed, gradients sent).

Replanning (:func:`replan`)
---------------------------
1. *Started* (:func:`assumed_started`): every entry reported done, and on
   each GPU the first entry not done whose job's earlier rounds are done,
   which may be running (a GPU runs its entries in order, one at a time,
   and reports each as it ends; a round waits for the one before it); then
   the entries after it, in order, while each is of a round whose job's
   earlier rounds are done and planned to start by ``now`` (within
   ``start_margin_s``): a GPU takes its next entry as soon as one has
   computed, while that one's gradients are still being sent (its report
   comes only then), and never begins an entry before its planned start.
2. *Kept* (:func:`~scheduling.policies.hare.sequences.keep`): every unit
   (a job's round) under way stays whole and in place; then the rounds the
   aggregator applied and the jobs no longer in the snapshot are dropped
   (:func:`~scheduling.policies.hare.sequences.forget`).
3. *Planned*: each job from its first round not kept, for at most
   ``horizon_rounds`` rounds (the planning horizon: a live job has
   10^3-10^6 rounds, and a server's sequence must fit a message), each
   entry one real round; each GPU free when its last kept entry not done
   ends by the plan (at least ``now``), each job's next round ready when its
   kept entries are done (synchronised) by the plan. Within the horizon the
   policy sees the job as that long: a departure from the simulator, whose
   policy sees every round (docs/hare.md, "Live mechanism").
4. The new entries of each GPU are coalesced (consecutive micro-batches of
   one round of one job become one entry: one run, one report) after the
   kept ones, under the next revision.

On the wire (:func:`sequence_messages`, :func:`done_key`) a revision is one
``task_sequence`` per server, with its GPUs' entries not reported done; a
``task_done`` names the entry it reports by its key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set

import msgspec

from scheduling.policies.hare.model import Gpu, GpuId, TaskJob, TaskPolicy, TaskProblem
from scheduling.policies.hare.sequences import (
    Entry,
    EntryKey,
    Sequences,
    coalesce,
    empty,
    forget,
    fronts,
    keep,
    plan,
)
from shared.events import TaskDone, TaskSequence
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, RoundsApplied, TaskEntry


class TaskSnapshot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the leader knows at ``now`` (module docstring)."""

    now: float
    jobs: tuple[TaskJob, ...]
    gpus: tuple[Gpu, ...]
    done: frozenset[EntryKey] = frozenset()


class LiveTaskSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``horizon_rounds``: the most rounds of a job one revision sequences;
    ``check``: refuse an infeasible schedule (a policy's bug) before it is
    sent; ``start_margin_s``: how long (wall seconds) a revision may take to
    reach an executor, so that an entry planned to start that soon after a
    replan may have begun under the revision it replaces (step 1)."""

    horizon_rounds: int = 4
    check: bool = True
    start_margin_s: float = 0.05

    def __post_init__(self) -> None:
        if self.horizon_rounds < 1:
            raise ValueError(f"horizon_rounds must be >= 1, got {self.horizon_rounds}")
        if self.start_margin_s < 0:
            raise ValueError(f"start_margin_s must be >= 0, got {self.start_margin_s}")


def gpu_id(server: ServerId, index: int) -> GpuId:
    """The task model's id of GPU ``index`` of ``server``."""
    if index < 0:
        raise ValueError(f"GPU index must be >= 0, got {index}")
    return GpuId(f"{server}:{index}")


def split_gpu_id(gpu: GpuId) -> tuple[ServerId, int]:
    """``(server, index)`` of a :func:`gpu_id` (a server id may hold ``:``)."""
    server, sep, index = gpu.rpartition(":")
    if not (sep and server and index.isdigit()):
        raise ValueError(f"not a live GPU id (<server>:<index>): {gpu!r}")
    return ServerId(server), int(index)


def assumed_started(seqs: Sequences, done: Set[EntryKey],
                    by: float = -math.inf) -> set[EntryKey]:
    """The entries of ``seqs`` that may have started: those in ``done``,
    and on each GPU the first entry not in ``done`` where every entry of an
    earlier round of its job is done (it may be running; one whose earlier
    round still has work waits for that round's barrier), then each next
    one of such a round planned to start by ``by``: the GPU may have
    computed the one before and be sending its gradients (module
    docstring, step 1). ``by`` -inf: the first alone."""
    started = {e.key for _, e in seqs.entries() if e.key in done}
    open_round: dict[JobId, int] = {}  # each job's first round with work not done
    for _, e in seqs.entries():
        if e.key not in done and e.round < open_round.get(e.job, e.round + 1):
            open_round[e.job] = e.round
    for entries in seqs.gpus.values():
        waiting = [e for e in entries if e.key not in done]
        for i, e in enumerate(waiting):
            if e.round != open_round[e.job] or (i > 0 and e.start_s > by):
                break  # the GPU cannot have begun it, nor any after it
            started.add(e.key)
    return started


def live_problem(snap: TaskSnapshot, kept: Sequences, horizon_rounds: int) -> TaskProblem:
    """The problem of step 3 of the module docstring."""
    front = fronts(kept, snap.jobs)
    jobs = tuple(
        msgspec.structs.replace(j, done_rounds=front[j.id],
                                rounds=min(j.rounds, front[j.id] + horizon_rounds))
        for j in snap.jobs if front[j.id] < j.rounds)
    busy: dict[GpuId, float] = {}
    ready: dict[JobId, float] = {}
    for gpu, e in kept.entries():
        if e.key not in snap.done:
            busy[gpu] = max(busy.get(gpu, snap.now), e.end_s)
        ready[e.job] = max(ready.get(e.job, snap.now), e.done_s)
    gpus = tuple(msgspec.structs.replace(g, free_s=max(g.free_s, snap.now, busy.get(g.id, 0.0)))
                 for g in snap.gpus)
    planned = {j.id for j in jobs}
    return TaskProblem(jobs, gpus, snap.now,
                       {j: t for j, t in ready.items() if j in planned and t > snap.now})


def planned_tasks(snap: TaskSnapshot, horizon_rounds: int) -> int:
    """The most tasks (micro-batches) a replan of ``snap`` sequences: each
    job's S for each round left, up to the horizon; what its cost grows with."""
    return sum(j.tasks_per_round * min(horizon_rounds, j.rounds - j.done_rounds)
               for j in snap.jobs)


def replan(snap: TaskSnapshot, policy: TaskPolicy, previous: Sequences | None = None,
           settings: LiveTaskSettings | None = None) -> Sequences:
    """The next revision of every GPU's sequence (module docstring);
    ``previous`` None: the first (revision 1). ValueError when a kept entry
    is on a GPU the snapshot lacks (a lost GPU's started round: not handled
    yet) or the policy's schedule is infeasible."""
    cfg = settings or LiveTaskSettings()
    before = previous if previous is not None else empty((g.id for g in snap.gpus), snap.now)
    started = assumed_started(before, snap.done, snap.now + cfg.start_margin_s)
    kept = forget(keep(before, started),
                  {j.id: j.done_rounds for j in snap.jobs})
    problem = live_problem(snap, kept, cfg.horizon_rounds)
    # Q = budget // Σ S_n macro-rounds per job (scheduling.policies.hare.macro)
    # covers every job's rounds, so each entry is one real round.
    longest = max((j.remaining_rounds for j in problem.jobs), default=1)
    budget = max(1, longest * sum(j.tasks_per_round for j in problem.jobs))
    seqs = plan(problem, policy, kept, budget=budget, check=cfg.check)
    gpus = {g: kept.gpus.get(g, ()) + coalesce(entries[len(kept.gpus.get(g, ())):])
            for g, entries in seqs.gpus.items()}
    return msgspec.structs.replace(seqs, gpus=gpus)


def remaining(seqs: Sequences, done: Set[EntryKey]) -> dict[GpuId, tuple[Entry, ...]]:
    """Each GPU's entries not reported done: what its server still runs."""
    return {g: tuple(e for e in entries if e.key not in done) for g, entries in seqs.gpus.items()}


def sequence_messages(seqs: Sequences, done: Set[EntryKey], term: int, at: float,
                      specs: Mapping[JobId, JobSpec],
                      applied: Mapping[JobId, int] | None = None) -> tuple[TaskSequence, ...]:
    """Revision ``seqs`` as one ``task_sequence`` per server, each GPU with
    its entries not in ``done`` and the ``specs`` of their jobs; servers and
    GPUs in id order. With ``applied`` (each job's rounds applied), each
    message lists the rounds applied of every job it names: the server
    holds an entry of round r until r rounds of its job are applied, so it
    never starts a round before the job's earlier rounds are applied, on
    whichever servers they ran, and every entry it may run is one the
    leader counts as possibly started when it replans (step 1). ValueError
    for an entry of several rounds (a simulator's macro-task); KeyError for
    a job without a spec."""
    servers: dict[ServerId, list[GpuTasks]] = {}
    for gpu, left in remaining(seqs, done).items():
        server, index = split_gpu_id(gpu)
        wire = []
        for e in left:
            if e.rounds != 1:
                raise ValueError(f"entry {e.key} covers {e.rounds} rounds; live entries cover one")
            wire.append(TaskEntry(e.job, e.round, e.lo, e.hi, e.start_s, e.end_s, e.hold))
        servers.setdefault(server, []).append(GpuTasks(index, tuple(wire)))
    messages = []
    for server, gpus in sorted(servers.items()):
        jobs = sorted({e.job_id for g in gpus for e in g.entries})
        rounds = () if applied is None else tuple(RoundsApplied(j, applied.get(j, 0))
                                                  for j in jobs)
        messages.append(TaskSequence(
            term=term, revision=seqs.revision, server_id=server, at=at,
            gpus=tuple(sorted(gpus, key=lambda g: g.gpu_index)), policy=seqs.policy,
            specs=tuple(specs[j] for j in jobs), applied=rounds))
    return tuple(messages)


def done_key(msg: TaskDone) -> EntryKey:
    """The entry a ``task_done`` reports."""
    return (msg.job_id, msg.round, msg.lo)


def done_problem(seqs: Sequences, msg: TaskDone) -> str | None:
    """Why the leader must not count ``msg`` against revision ``seqs``;
    None when it may: the entry it names must be in the sequence of the GPU
    it names, with the same micro-batches (a report of another server's,
    another GPU's or an invented task is refused)."""
    gpu = gpu_id(msg.server_id, msg.gpu_index)
    key = done_key(msg)
    mine = next((e for e in seqs.gpus.get(gpu, ()) if e.key == key), None)
    if mine is None:
        return f"GPU {gpu} has no entry {key} in revision {seqs.revision}"
    if mine.hi != msg.hi:
        return (f"entry {key} on GPU {gpu} is micro-batches {mine.lo}..{mine.hi - 1}, "
                f"not {msg.lo}..{msg.hi - 1}")
    return None
