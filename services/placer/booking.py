"""What each start of a plan books (pure, §3.1 step 9).

:func:`book` picks GPU indices on servers that are alive: the lowest
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
them (:func:`book_all`).

It stands apart from :mod:`services.placer.diff`, which decides what a plan
changes: booking needs only the starts and retunes wanted, what stays placed
and what each alive server has, not the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.placer.commands import (
    CONFLICT,
    SERVER_GONE,
    UNKNOWN_SERVER,
    Commands,
    Launch,
    Problem,
    Retune,
    Start,
    Want,
    placement_key,
)
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.records import Placement
from shared.resources import Ledger, OverAllocation, Resources


def free_indices(placements: Iterable[Placement], capacity: Mapping[ServerId, int]
                 ) -> dict[ServerId, list[int]]:
    """The GPU indices of each alive server that no placement books."""
    used: dict[ServerId, set[int]] = {s: set() for s in capacity}
    for p in placements:
        for s, idx in p.gpu_indices.items():
            if s in used:
                used[s].update(idx)
    return {s: [i for i in range(n) if i not in used[s]] for s, n in capacity.items()}


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
                                    f"job {job}: cannot change its cores: {why}",
                                    SERVER_GONE if missing else ""))
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
                                            "registered or not alive", SERVER_GONE)
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
