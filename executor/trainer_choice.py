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
place first; ties the lowest trainer index).
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


def place(holding: Sequence[Iterable[str]], upcoming: Sequence[str],
          capacity: int) -> Placement:
    """Where the next task, ``upcoming[0]``'s, runs, given the models each
    trainer holds (``holding[i]``: trainer i's), and what that trainer
    moves out to keep at most ``capacity`` (module doc)."""
    if not holding:
        raise ValueError("need at least one trainer")
    held = [frozenset(h) for h in holding]
    job = upcoming[0] if upcoming else ""
    for i, jobs in enumerate(held):
        if job in jobs:
            victims = jobs - kept(jobs, upcoming, capacity)
            return Placement(i, tuple(sorted(victims)), load=False)
    best: tuple[int, int] | None = None
    choice = Placement(0, (), load=True)
    for i, jobs in enumerate(held):
        victims = jobs - kept(jobs, upcoming, capacity)
        # A free place beats any move; else the move whose model is needed latest.
        score = min((next_use(v, upcoming) for v in victims), default=len(upcoming) + 1)
        if best is None or score > best[0]:
            best = (score, i)
            choice = Placement(i, tuple(sorted(victims)), load=True)
    return choice
