"""Per-GPU task sequences: what a task policy's schedule becomes on the GPUs,
and how a replan keeps what has started (hare.md §3: "these task sequences
are sent to corresponding executors"; §5.2, Algorithm 1's x̃_i, ỹ_{i,m}).

The one core of both the online task simulator (:mod:`simulator.tasks`) and
the live leader (:mod:`scheduling.live.tasks`); neither keeps a copy.

Sequences
---------
A :class:`Sequences` maps each GPU to its :class:`Entry` list, in the order
the GPU runs them. An entry is micro-batches ``lo .. hi - 1`` (task slots,
``0 <= lo < hi <= S``) of real rounds ``round .. round + rounds - 1`` of one
job. Live, an entry is one round (``rounds`` = 1); the simulator's
macro-tasks (:mod:`.macro`) stand for several rounds of one slot. Its
``start_s`` and ``end_s`` are the plan's (the GPU is busy ``[start_s,
end_s)``) and ``done_s`` adds its synchronisation (its part of the barrier,
constraint (7)). ``hold`` marks a job's first round of the plan: the policy
decided when that job starts (FIFO's head-of-line wait), so the entry does
not start before ``start_s``; later rounds follow their barriers.

Each GPU's entries are the policy's tasks on it in order of planned start,
ties by (job, round, slot): Algorithm 1's sequence on that GPU.

Replanning
----------
:func:`keep` is what a replan may not touch. A *unit* is one job's rounds
``round .. round + rounds - 1`` (every slot of it); a unit is *under way*
once any of its entries has started. The problem model (:class:`~.model.
TaskJob`, ``done_rounds``) can re-plan only whole rounds, so an under-way
unit is kept whole: its started entries never move, and its unstarted ones
stay where they were planned, in order. Every other entry is dropped and
planned again from the job's :func:`fronts` (its first round not under
way). :func:`plan` appends the new entries after the kept ones on each GPU,
so a started entry keeps its GPU and its place, and the revision grows by
one. :func:`forget` drops the entries of rounds the caller counts as done
(the job's ``done_rounds`` says so from then on) and of jobs that left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set

import msgspec

from scheduling.policies.hare.checks import check_schedule
from scheduling.policies.hare.macro import DEFAULT_BUDGET, MacroJob, macro_problem
from scheduling.policies.hare.model import GpuId, TaskJob, TaskPolicy, TaskProblem, TaskSchedule
from shared.ids import JobId

EntryKey = tuple[JobId, int, int]  # (job, first real round, first micro-batch)


class Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Micro-batches ``lo .. hi - 1`` of rounds ``round .. round + rounds - 1``
    of ``job``, planned on its GPU over ``[start_s, end_s)``, synchronised
    by ``done_s``; ``hold``: not before ``start_s`` (module docstring)."""

    job: JobId
    round: int
    lo: int
    hi: int
    start_s: float
    end_s: float
    done_s: float
    rounds: int = 1
    hold: bool = False

    def __post_init__(self) -> None:
        if self.round < 0 or self.rounds < 1:
            raise ValueError(f"entry of job {self.job}: need round >= 0 and rounds >= 1")
        if not 0 <= self.lo < self.hi:
            raise ValueError(
                f"entry of job {self.job}: need 0 <= lo < hi, got {self.lo}..{self.hi}")
        if not self.start_s <= self.end_s <= self.done_s:
            raise ValueError(f"entry of job {self.job}: need start_s <= end_s <= done_s")

    @property
    def key(self) -> EntryKey:
        return (self.job, self.round, self.lo)

    @property
    def unit(self) -> tuple[JobId, int]:
        """The job's rounds this entry is a slot of (module docstring)."""
        return (self.job, self.round)

    @property
    def next_round(self) -> int:
        return self.round + self.rounds


class Sequences(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Revision ``revision`` of every GPU's sequence, planned at ``now`` by
    ``policy``; ``lower_bound`` is the policy's (None: none); ``solve_s``
    the policy's time on it by the injected timer (none: 0)."""

    revision: int
    now: float
    policy: str
    gpus: dict[GpuId, tuple[Entry, ...]]
    lower_bound: float | None = None
    solve_s: float = 0.0

    def entries(self) -> Iterable[tuple[GpuId, Entry]]:
        for gpu, entries in self.gpus.items():
            for e in entries:
                yield gpu, e


def empty(gpus: Iterable[GpuId], now: float = 0.0, policy: str = "") -> Sequences:
    """Revision 0: no GPU has an entry."""
    return Sequences(0, now, policy, {g: () for g in gpus})


def keep(seqs: Sequences, started: Set[EntryKey]) -> Sequences:
    """The entries of ``seqs`` a replan keeps: those of every unit under way
    (one of its entries in ``started``) and of every earlier unit of its job,
    in their order (module docstring). A job's round cannot start before the
    one before it is done, so the earlier units are under way too; keeping
    them whatever ``started`` says means the kept rounds of a job never have
    a hole the replan could not fill. Same revision: nothing is planned yet."""
    # Attributes, not the properties: this runs at every replan of a simulation.
    last: dict[JobId, int] = {}  # each job's last unit under way
    for entries in seqs.gpus.values():
        for e in entries:
            if (e.job, e.round, e.lo) in started and e.round > last.get(e.job, -1):
                last[e.job] = e.round
    kept = {g: tuple(e for e in entries if e.round <= last.get(e.job, -1))
            for g, entries in seqs.gpus.items()}
    return msgspec.structs.replace(seqs, gpus=kept)


def forget(kept: Sequences, applied: Mapping[JobId, int]) -> Sequences:
    """``kept`` less the entries of rounds before ``applied[job]`` (done:
    the job's ``done_rounds`` covers them from now on) and of jobs not in
    ``applied`` (they left)."""
    gpus = {g: tuple(e for e in entries if e.job in applied and e.next_round > applied[e.job])
            for g, entries in kept.gpus.items()}
    return msgspec.structs.replace(kept, gpus=gpus)


def fronts(kept: Sequences, jobs: Iterable[TaskJob]) -> dict[JobId, int]:
    """Each job's first round that ``kept`` does not hold: where a replan
    starts it (at least its ``done_rounds``)."""
    front = {j.id: j.done_rounds for j in jobs}
    for _, e in kept.entries():
        if e.job in front:
            front[e.job] = max(front[e.job], e.next_round)
    return front


def _entries(schedule: TaskSchedule, macros: tuple[MacroJob, ...]) -> dict[GpuId, list[Entry]]:
    """The schedule's tasks (on the macro problem) as real-round entries,
    by GPU in order of planned start, ties by (job, round, slot)."""
    by_job = {m.job.id: m for m in macros}
    real: dict[tuple[JobId, int], range] = {}  # a macro-round's real rounds
    out: dict[GpuId, list[Entry]] = {}
    for t in sorted(schedule.tasks, key=lambda t: (t.start_s, t.job, t.round, t.index)):
        rounds = real.get((t.job, t.round))
        if rounds is None:
            rounds = real[(t.job, t.round)] = by_job[t.job].real_rounds_of(t.round)
        out.setdefault(t.gpu, []).append(Entry(
            t.job, rounds.start, t.index, t.index + 1, t.start_s, t.end_s, t.done_s,
            rounds=len(rounds), hold=t.round == 0))
    return out


def plan(problem: TaskProblem, policy: TaskPolicy, kept: Sequences, *,
         budget: int = DEFAULT_BUDGET, check: bool = True,
         timer: Callable[[], float] | None = None) -> Sequences:
    """Revision ``kept.revision + 1``: ``kept`` (from :func:`keep`), then on
    each GPU the tasks ``policy`` places for ``problem``, grouped into
    macro-tasks of at most ``budget`` (:mod:`.macro`; each entry is one
    round when ``budget >= Σ_n S_n × max_n R_n``). The
    problem's jobs must start at ``fronts(kept, ...)``; its GPUs must
    include every GPU with a kept entry (a GPU without one may have left).
    ``check``: refuse an infeasible schedule (:func:`~.checks.check_schedule`,
    ValueError). ``timer`` times the policy's call alone."""
    missing = {g for g, entries in kept.gpus.items() if entries} - {g.id for g in problem.gpus}
    if missing:
        raise ValueError(f"sequences: kept entries on GPUs the problem lacks: {sorted(missing)}")
    front = fronts(kept, problem.jobs)
    for job in problem.jobs:
        if job.done_rounds != front[job.id]:
            raise ValueError(f"sequences: job {job.id} is planned from round {job.done_rounds}, "
                             f"but its first round not kept is {front[job.id]}")
    new: dict[GpuId, list[Entry]] = {}
    lower: float | None = None
    solve = 0.0
    if any(j.remaining_rounds for j in problem.jobs):
        grouped, macros = macro_problem(problem, budget)
        start = timer() if timer else 0.0
        schedule = policy.schedule(grouped)
        solve = (timer() - start) if timer else 0.0
        if check:
            check_schedule(grouped, schedule)
        new, lower = _entries(schedule, macros), schedule.lower_bound
    gpus = {g.id: kept.gpus.get(g.id, ()) + tuple(new.get(g.id, ())) for g in problem.gpus}
    return Sequences(kept.revision + 1, problem.now, policy.name, gpus, lower, solve)


def coalesce(entries: Iterable[Entry]) -> tuple[Entry, ...]:
    """Consecutive entries of one GPU for the same rounds of the same job
    with adjacent micro-batches (and the same ``hold``) as one entry over
    their union: what an executor runs without a switch, one report."""
    out: list[Entry] = []
    for e in entries:
        last = out[-1] if out else None
        if (last is not None and last.unit == e.unit and last.rounds == e.rounds
                and last.hi == e.lo and last.hold == e.hold):
            out[-1] = msgspec.structs.replace(last, hi=e.hi, end_s=e.end_s,
                                              done_s=max(last.done_s, e.done_s))
        else:
            out.append(e)
    return tuple(out)
