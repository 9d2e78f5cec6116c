"""The placer's decisions (pure): what a plan changes, and which GPUs each
start gets (§3.1, step 9: "the placer executes the resource allocation").

:func:`changes` compares a plan with the placements in ``hops_alloc``:

* a job assigned the configuration it holds keeps running untouched;
* a job assigned another configuration is stopped and started again on the
  new one (a resize: restart from its checkpoint);
* a running job assigned the same GPU parts and memory but other CPU cores
  or another memory-bandwidth cap (CODA's core tuning, or its contention
  eliminator halving a CPU job's cores or capping it by MBA) is *retuned*:
  it keeps running on its GPUs and only its cores or cap change, with a
  ``set_cores`` to each server where they do (:class:`Retune`);
* on a round's first plan, every other running job is stopped; a plan later
  in the round only adds (§3.6), so it stops nothing else;
* a profiling task (§3.2) starts a profiling run of the job on one server;
  the runs of one job on several GPU types share its placement, and a run
  already going on that server is left alone. Profiling runs are never
  stopped by a plan: they end by themselves.

Requests the placer cannot carry out are :class:`Problem`\\ s and the rest of
the plan still applies: unknown or ended jobs, a run for a job still
profiling (or the reverse), a job assigned twice.

:func:`book` then picks GPU indices on servers that are alive: the lowest
free ones, profiling runs first (the profiling queue goes first, §3.2). An
index booked by any placement left after the stops is never booked again,
and a start that does not fit, or names a server that is not alive, is a
problem too. Besides GPUs a start holds what its configuration demands of
the other resources (CPU cores, memory: ``Configuration.extras``); those are
booked on a :class:`shared.resources.Ledger` that already holds what the
placements left hold, so that no server is over-allocated in any resource,
and a start that does not fit is refused naming the server and the
resource. A retune books the difference: its job's placement is booked on
that ledger already, and is booked again with the new demands (a growth
that does not fit is a problem, and the job keeps what it holds); retunes
are booked before the starts, so the cores a retune gives back are free to
them (:func:`book_all`). :func:`diff` is both steps for a plan whose stops
all succeed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.records import JobRecord, Placement
from shared.resources import Ledger, OverAllocation, Resources
from shared.snapshot import Plan

Mode = Literal["run", "profile"]
NOT_FOUND = "not_found"
INVALID = "invalid"
CONFLICT = "conflict"
UNKNOWN_SERVER = "unknown_server"
NOT_IN_PLAN = "not in the plan"
RESIZE = "resize"


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
    job_id: JobId
    code: str
    error: str


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


def _refuse(job: JobId, jobs: Mapping[JobId, JobRecord]) -> Problem | None:
    rec = jobs.get(job)
    if rec is None:
        return Problem(job, NOT_FOUND, f"job {job} is unknown to the scheduler")
    if rec.final:
        return Problem(job, INVALID, f"job {job} is {rec.phase}")
    return None


@dataclass
class _Assigned:
    """What the assignments of a plan change, as :func:`_assignments` finds it."""

    stops: list[Stop] = field(default_factory=list)
    wants: list[Want] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    retunes: list[Retune] = field(default_factory=list)
    kept: set[JobId] = field(default_factory=set)  # unchanged, resized, retuned, profiling
    seen: set[JobId] = field(default_factory=set)  # assigned


def _assignments(current: Mapping[JobId, Placement], plan: Plan,
                 jobs: Mapping[JobId, JobRecord]) -> _Assigned:
    """Stops, wants, retunes and problems of the assignments."""
    out = _Assigned()
    stops, wants, problems, seen, kept = out.stops, out.wants, out.problems, out.seen, out.kept
    for a in plan.assignments:
        job = a.job_id
        if job in seen:
            problems.append(Problem(job, INVALID, f"job {job} is assigned twice in the plan"))
            continue
        seen.add(job)
        refusal = _refuse(job, jobs)
        cur = current.get(job)
        if refusal is not None:
            problems.append(refusal)
        elif cur is None:
            wants.append(Want(job, a.config, "run"))
        elif cur.mode == "profile":
            kept.add(job)
            problems.append(Problem(job, CONFLICT, f"job {job} is still profiling"))
        elif cur.configuration == a.config:
            kept.add(job)
        elif _cores_only(cur.configuration, a.config):
            kept.add(job)
            out.retunes.append(Retune(job, cur, a.config))
        else:
            kept.add(job)
            stops.append(Stop(job, cur, resize=True, reason=RESIZE))
            wants.append(Want(job, a.config, "run", resize=True))
    return out


def _cores_only(old: Configuration, new: Configuration) -> bool:
    """Whether ``new`` differs from ``old`` in CPU cores or bandwidth cap alone."""
    return old.parts == new.parts and all(
        old.demand_on(s).memory_mb == new.demand_on(s).memory_mb for s in new.servers)


def _profiling(current: Mapping[JobId, Placement], plan: Plan, jobs: Mapping[JobId, JobRecord],
               assigned: set[JobId]) -> tuple[list[Want], list[Problem]]:
    added: dict[JobId, dict[ServerId, int]] = {}
    problems: list[Problem] = []
    for task in plan.profiling:
        job = task.job_id
        refusal = _refuse(job, jobs)
        cur = current.get(job)
        if refusal is not None:
            problems.append(refusal)
        elif job in assigned or (cur is not None and cur.mode == "run"):
            problems.append(Problem(job, CONFLICT, f"job {job} cannot profile on "
                                                   f"{task.server}: it is assigned to run"))
        elif cur is not None and task.server in cur.configuration.servers:
            continue  # that profiling run is already going
        else:
            added.setdefault(job, {})[task.server] = task.gpus
    wants = [Want(job, Configuration.of(parts), "profile") for job, parts in added.items()]
    return wants, problems


def changes(current: Mapping[JobId, Placement], plan: Plan, first_plan: bool,
            jobs: Mapping[JobId, JobRecord]) -> Changes:
    """What ``plan`` changes in ``current`` (see the module docstring)."""
    a = _assignments(current, plan, jobs)
    if first_plan:
        for job, p in sorted(current.items()):
            if p.mode == "run" and job not in a.kept:
                a.stops.append(Stop(job, p, resize=False, reason=NOT_IN_PLAN))
    profile_wants, profile_problems = _profiling(current, plan, jobs, a.seen)
    return Changes(tuple(a.stops), tuple(profile_wants + a.wants),
                   tuple(a.problems + profile_problems), tuple(a.retunes))


def free_indices(placements: Iterable[Placement], capacity: Mapping[ServerId, int]
                 ) -> dict[ServerId, list[int]]:
    """The GPU indices of each alive server that no placement books."""
    used: dict[ServerId, set[int]] = {s: set() for s in capacity}
    for p in placements:
        for s, idx in p.gpu_indices.items():
            if s in used:
                used[s].update(idx)
    return {s: [i for i in range(n) if i not in used[s]] for s, n in capacity.items()}


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


def held_ledger(placements: Mapping[JobId, Placement],
                capacity: Mapping[ServerId, Resources]) -> Ledger:
    """A ledger of the alive servers' ``capacity`` holding what ``placements``
    hold there (holder ``held:<job>``). A placement that no longer fits
    (none should) holds what is left: nothing more is booked over it."""
    ledger = Ledger(capacity)
    for job, p in sorted(placements.items()):
        demands = {s: d for s, d in p.configuration.demands().items() if s in capacity}
        try:
            ledger.book(f"held:{job}", demands)
        except OverAllocation:
            ledger.book(f"held:{job}", {s: _at_most(d, ledger.free(s))
                                        for s, d in demands.items()})
    return ledger


def _at_most(want: Resources, free: Resources) -> Resources:
    """``want`` capped, resource by resource, at ``free``."""
    return want.minus(want.minus(free))


def book(wants: Iterable[Want], placements: Mapping[JobId, Placement],
         capacity: Mapping[ServerId, Resources], prefix: str, at: float = 0.0
         ) -> tuple[tuple[Start, ...], tuple[Problem, ...]]:
    """GPU indices for ``wants`` given the ``placements`` that stay, and the
    other resources they demand (see the module docstring); ``capacity``
    holds what each alive server has."""
    booked = book_all(wants, (), placements, capacity, prefix, at)
    return booked.starts, booked.problems


def book_all(wants: Iterable[Want], retunes: Iterable[Retune],
             placements: Mapping[JobId, Placement], capacity: Mapping[ServerId, Resources],
             prefix: str, at: float = 0.0) -> Commands:
    """:func:`book` with ``retunes`` booked first (see the module docstring):
    the starts and retunes that fit, and the problems (no stops)."""
    ledger = held_ledger(placements, capacity)
    fitted, problems = _book_retunes(retunes, ledger, capacity)
    starts, start_problems = _book_starts(wants, placements, capacity, ledger, prefix, at)
    return Commands(starts=starts, problems=problems + start_problems, retunes=fitted)


def _book_retunes(retunes: Iterable[Retune], ledger: Ledger,
                  capacity: Mapping[ServerId, Resources]
                  ) -> tuple[tuple[Retune, ...], tuple[Problem, ...]]:
    fitted: list[Retune] = []
    problems: list[Problem] = []
    for r in sorted(retunes, key=lambda r: not r.shrinks):  # stable: plan order kept
        job, demands = r.job_id, r.configuration.demands()
        missing = [s for s in demands if s not in capacity]
        why = (f"server {missing[0]} is not registered or not alive" if missing
               else ledger.refusal(demands, f"held:{job}"))
        if why is not None:
            problems.append(Problem(job, UNKNOWN_SERVER if missing else CONFLICT,
                                    f"job {job}: cannot change its cores: {why}"))
            continue
        ledger.book(f"held:{job}", demands)
        fitted.append(r)
    return tuple(fitted), tuple(problems)


def _book_starts(wants: Iterable[Want], placements: Mapping[JobId, Placement],
                 capacity: Mapping[ServerId, Resources], ledger: Ledger, prefix: str,
                 at: float) -> tuple[tuple[Start, ...], tuple[Problem, ...]]:
    free = free_indices(placements.values(), {s: c.gpus for s, c in capacity.items()})
    ordered = sorted(wants, key=lambda w: w.mode != "profile")  # stable: plan order kept
    starts: list[Start] = []
    problems: list[Problem] = []
    for want in ordered:
        problem = _refusal(want, free, ledger, capacity)
        if problem is not None:
            problems.append(problem)
            continue
        ledger.book(f"start:{want.job_id}", want.configuration.demands())
        taken = {s: tuple(free[s][:g]) for s, g in want.configuration.parts}
        for s, idx in taken.items():
            free[s] = free[s][len(idx):]
        starts.append(_start(want, taken, placements.get(want.job_id), prefix, at))
    return tuple(starts), tuple(problems)


def _refusal(want: Want, free: Mapping[ServerId, list[int]], ledger: Ledger,
             capacity: Mapping[ServerId, Resources]) -> Problem | None:
    """Why ``want`` cannot start now: a server not alive, too few free GPUs,
    or too little of another resource; None when it fits."""
    job, config = want.job_id, want.configuration
    missing = [s for s in config.servers if s not in capacity]
    if missing:
        return Problem(job, UNKNOWN_SERVER, f"job {job}: server {missing[0]} is not "
                                            "registered or not alive")
    short = [s for s, g in config.parts if len(free[s]) < g]
    if short:
        s = short[0]
        return Problem(job, CONFLICT, f"job {job}: {s} has {len(free[s])} free GPUs, "
                                      f"the plan needs {config.as_dict()[s]}")
    why = ledger.refusal(config.demands(), f"start:{job}")
    if why is not None:
        return Problem(job, CONFLICT, f"job {job}: {why}")
    return None


def _start(want: Want, taken: dict[ServerId, tuple[int, ...]], old: Placement | None,
           prefix: str, at: float) -> Start:
    key = placement_key(prefix, want.job_id)
    if want.mode == "run":
        placement = Placement(job_id=want.job_id, configuration=want.configuration,
                              gpu_indices=taken, mode="run", key=key, at=at)
        launches = tuple(Launch(s, want.configuration, taken[s]) for s in taken)
        return Start(want.job_id, placement, launches, want.resize)
    parts = dict(old.configuration.parts) if old is not None else {}
    indices = dict(old.gpu_indices) if old is not None else {}
    parts.update(want.configuration.as_dict())
    indices.update(taken)
    placement = Placement(job_id=want.job_id, configuration=Configuration.of(parts),
                          gpu_indices=indices, mode="profile", key=key, at=at)
    launches = tuple(Launch(s, Configuration.of({s: g}), taken[s])
                     for s, g in want.configuration.parts)
    return Start(want.job_id, placement, launches, resize=False)


def diff(current: Mapping[JobId, Placement], plan: Plan, first_plan: bool,
         jobs: Mapping[JobId, JobRecord], capacity: Mapping[ServerId, Resources], prefix: str,
         at: float = 0.0) -> Commands:
    """:func:`changes` then :func:`book`, assuming every stop succeeds."""
    ch = changes(current, plan, first_plan, jobs)
    stopped = {s.job_id for s in ch.stops}
    left = {j: p for j, p in current.items() if j not in stopped}
    booked = book_all(ch.wants, ch.retunes, left, capacity, prefix, at)
    return Commands(ch.stops, booked.starts, ch.problems + booked.problems, booked.retunes)
