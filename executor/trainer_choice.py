"""Which models a GPU's resident trainers keep: Hare's speculative memory
management (hare.md §4; docs/hare.md §7, step 4). Pure: no process, clock
or environment; the pool (:mod:`executor.trainers`) is its shell.

A GPU runs its task sequence in order. Each of its trainer processes holds
at most ``capacity`` models in memory; a model moved out costs a reload
when its job's task comes again. Hare keeps "the models of the jobs whose
tasks will be executed soon" in GPU memory: so of the models a trainer
holds, plus the next task's, it keeps the ``capacity`` whose next task in
the sequence comes soonest (a model with no task left in the sequence
last; ties by job id, so that the rule is deterministic). This is
Belady's rule over the known sequence, which is what a GPU's sequence lets
the executor see.

The next task runs on the trainer that holds its model; when none does, on
the trainer where loading it moves out the model needed latest (a free
place first; ties the trainer holding fewest models, so that the GPU's
jobs spread over its processes and the next task can be readied on one
while another computes, then the lowest trainer index).

**Tenants never share a process** (Hare's isolation of jobs, docs/hare.md
§7): a trainer runs the scripts of one tenant until it is reset (a fresh
process: nothing of the last tenant's code, models or memory survives). A
task goes only to a trainer that is free (no tenant yet) or its own
tenant's; when every trainer is another tenant's, the one whose models are
needed latest is reset for it. A plain ``kept`` by models alone could give
a trainer that ran tenant A's script, with whatever that script left in
the process, to tenant B.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def next_use(job: str, upcoming: Sequence[str]) -> int:
    """The place of ``job``'s next task in ``upcoming`` (``len(upcoming)``
    when it has none there)."""
    for i, other in enumerate(upcoming):
        if other == job:
            return i
    return len(upcoming)


def kept(resident: Iterable[str], upcoming: Sequence[str], capacity: int) -> frozenset[str]:
    """Of the models ``resident`` on a trainer and the model of
    ``upcoming[0]``, the next task's, the ``capacity`` to keep (module doc).
    ValueError for no task or a capacity below 1."""
    if not upcoming or capacity < 1:
        raise ValueError(f"need a next task and a capacity >= 1, got {len(upcoming)} tasks, "
                         f"capacity {capacity}")
    candidates = {*resident, upcoming[0]}
    ranked = sorted(candidates, key=lambda job: (next_use(job, upcoming), job))
    return frozenset(ranked[:capacity])


@dataclass(frozen=True)
class Placement:
    """Run the next task on trainer ``trainer``, after moving out ``evict``
    (job ids, sorted) there; ``load``: its model is not held there yet."""

    trainer: int
    evict: tuple[str, ...]
    load: bool
    reset: bool = False  # another tenant's trainer: a fresh process first


def place(holding: Sequence[Iterable[str]], upcoming: Sequence[str], capacity: int,
          owners: Sequence[str | None] = (), tenant: str | None = None) -> Placement:
    """Where the next task, ``upcoming[0]``'s, runs, given the models each
    trainer holds (``holding[i]``: trainer i's), and what that trainer
    moves out to keep at most ``capacity`` (module doc). ``owners[i]``:
    the tenant trainer i serves (None: none yet; ``()``: no tenants at
    all), ``tenant`` the task's."""
    if not holding:
        raise ValueError("need at least one trainer")
    held = [frozenset(h) for h in holding]
    owner = list(owners) or [None] * len(held)
    if len(owner) != len(held):
        raise ValueError(f"{len(owner)} owners for {len(held)} trainers")
    mine = [i for i in range(len(held)) if owner[i] in (None, tenant)]
    if not mine:  # every trainer is another tenant's: reset the one needed latest
        latest = max(range(len(held)), key=lambda i: (min(
            (next_use(j, upcoming) for j in held[i]), default=len(upcoming)), -i))
        return Placement(latest, (), load=True, reset=True)
    job = upcoming[0] if upcoming else ""
    for i in mine:
        if job in held[i]:
            victims = held[i] - kept(held[i], upcoming, capacity)
            return Placement(i, tuple(sorted(victims)), load=False)
    best: tuple[int, int] | None = None
    choice = Placement(mine[0], (), load=True)
    for i in mine:
        victims = held[i] - kept(held[i], upcoming, capacity)
        # A free place beats any move; else the move whose model is needed latest.
        # Then the trainer holding fewest models: the GPU's jobs spread over its
        # processes, so a task can be readied on one while another computes.
        score = (min((next_use(v, upcoming) for v in victims), default=len(upcoming) + 1),
                 -len(held[i]))
        if best is None or score > best:
            best = score
            choice = Placement(i, tuple(sorted(victims)), load=True)
    return choice
