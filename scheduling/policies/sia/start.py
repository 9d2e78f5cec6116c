"""A starting solution for Sia's type-level ILP (:mod:`.sia`).

Why: on the 512-GPU, 500-job run HiGHS spends most of Sia's time finding the
optimum, not proving it. Given each round's optimum as its start, the run's
solves take about 40% of the time they take from the LP optimum rounded down
(``bench/sia_start.py --min-s 0``). The start changes no gap: HiGHS still
proves the answer to Sia's 1e-4.

Once every job has a *home* GPU type, the ILP falls apart into one multiple-
choice knapsack per type (the job rows only say "at most one column"), and
each is solved exactly by dynamic programming over that type's free GPUs.
So the search is over homes:

1. homes from a few sources (the LP relaxation's types, the types of the
   best reduced costs, the jobs' current allocations);
2. per type, prefix and suffix knapsack tables give in one pass the value
   of the type without each of its jobs, and the value of another type with
   one more job is a lookup: the best move of one job to another type is
   applied until none improves (a local optimum over single moves);
3. two jobs on different types with the same GPU count swap types when
   that pays (a move the knapsacks cannot see, as neither type's capacity
   changes), and the moves of step 2 run again.

The best of the sources is the start. Everything is exact arithmetic on the
columns' coefficients, deterministic, and feasible by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
# (GPUs, coefficient, column) of one column of a job on one type
Option = tuple[int, float, int]
_EPS = 1e-9
_MAX_MOVES = 50
_ROUNDS = 3


@dataclass(frozen=True)
class Columns:
    """The ILP's columns: job index (0..jobs-1), type index, GPUs, coefficient."""

    job: Ints
    gpu_type: Ints
    gpus: Ints
    coeff: Floats
    jobs: int
    capacity: tuple[int, ...]

    def options(self) -> list[list[list[Option]]]:
        """``opts[j][t]``: job j's columns on type t."""
        opts: list[list[list[Option]]] = [
            [[] for _ in self.capacity] for _ in range(self.jobs)
        ]
        for c in range(len(self.coeff)):
            opts[self.job[c]][self.gpu_type[c]].append(
                (int(self.gpus[c]), float(self.coeff[c]), c)
            )
        return opts


def _add_job(f: Floats, options: Sequence[Option]) -> Floats:
    """The knapsack table ``f`` (best value within c GPUs, for each c) with
    one more job that takes at most one of ``options``."""
    best = f.copy()
    for g, v, _ in options:
        if 0 < g < len(f):
            np.maximum(best[g:], f[: len(f) - g] + v, out=best[g:])
        elif g == 0:
            np.maximum(best, f + v, out=best)
    return best


class _TypeTables:
    """Prefix and suffix knapsack tables of one type's jobs."""

    def __init__(self, members: list[int], opts: list[list[list[Option]]], t: int, cap: int):
        self.members = members
        lists = [opts[j][t] for j in members]
        n = len(members)
        self.prefix = np.zeros((n + 1, cap + 1))
        suffix = np.zeros((n + 1, cap + 1))
        for k in range(n):
            self.prefix[k + 1] = _add_job(self.prefix[k], lists[k])
        for k in range(n - 1, -1, -1):
            suffix[k] = _add_job(suffix[k + 1], lists[k])
        self.table = self.prefix[n]
        self.value = float(self.table[cap])
        # The type's value without member k: the best split of the GPUs
        # between the members before k and those after it.
        self.without = (self.prefix[:-1] + suffix[1:, ::-1]).max(axis=1)
        self._lists = lists

    def with_job(self, options: Sequence[Option]) -> float:
        """The type's value with one more job (exact: ``table`` is monotone)."""
        cap = len(self.table) - 1
        added = [float(self.table[cap - g]) + v for g, v, _ in options if g <= cap]
        return max([self.value, *added])

    def chosen(self) -> list[int]:
        """The columns of an optimal solution of this type's knapsack."""
        c = len(self.table) - 1
        out: list[int] = []
        for k in range(len(self.members) - 1, -1, -1):
            if self.prefix[k + 1][c] == self.prefix[k][c]:
                continue
            for g, v, col in self._lists[k]:
                if g <= c and self.prefix[k][c - g] + v == self.prefix[k + 1][c]:
                    out.append(col)
                    c -= g
                    break
        return out


def _best_move(
    tables: list[_TypeTables], opts: list[list[list[Option]]]
) -> tuple[int, int, int] | None:
    """(job, from type, to type) of the single move that gains most, if any."""
    best, move = _EPS, None
    for a, ta in enumerate(tables):
        for k, j in enumerate(ta.members):
            loss = ta.without[k] - ta.value
            for b, tb in enumerate(tables):
                if b == a or not opts[j][b]:
                    continue
                gain = loss + tb.with_job(opts[j][b]) - tb.value
                if gain > best:
                    best, move = gain, (j, a, b)
    return move


def _settle(homes: list[int], opts: list[list[list[Option]]], cols: Columns) -> list[int]:
    """Single moves until none improves; returns the chosen columns."""
    members = [[j for j, h in enumerate(homes) if h == t] for t in range(len(cols.capacity))]
    tables = [_TypeTables(m, opts, t, cols.capacity[t]) for t, m in enumerate(members)]
    for _ in range(_MAX_MOVES):
        move = _best_move(tables, opts)
        if move is None:
            break
        j, a, b = move
        members[a].remove(j)
        members[b].append(j)
        for t in (a, b):
            tables[t] = _TypeTables(members[t], opts, t, cols.capacity[t])
    return [c for t in tables for c in t.chosen()]


def _swap(chosen: list[int], cols: Columns, index: dict[tuple[int, int, int], int]) -> bool:
    """Apply the best type swap between two chosen columns of equal GPUs;
    whether one paid."""
    by_gpus: dict[int, list[int]] = {}
    for pos, c in enumerate(chosen):
        by_gpus.setdefault(int(cols.gpus[c]), []).append(pos)
    best, pair = _EPS, None
    for g, positions in by_gpus.items():
        for x, p in enumerate(positions):
            cp = chosen[p]
            for q in positions[x + 1 :]:
                cq = chosen[q]
                tp, tq = int(cols.gpu_type[cp]), int(cols.gpu_type[cq])
                if tp == tq:
                    continue
                p2 = index.get((int(cols.job[cp]), tq, g))
                q2 = index.get((int(cols.job[cq]), tp, g))
                if p2 is None or q2 is None:
                    continue
                gain = cols.coeff[p2] + cols.coeff[q2] - cols.coeff[cp] - cols.coeff[cq]
                if gain > best:
                    best, pair = gain, (p, q, p2, q2)
    if pair is None:
        return False
    p, q, p2, q2 = pair
    chosen[p], chosen[q] = p2, q2
    return True


def search(cols: Columns, homes: Sequence[int]) -> list[int]:
    """Steps 2 and 3 of the module docstring from one set of homes (-1: the
    job has no home); the chosen columns."""
    return _search(cols, cols.options(), column_index(cols), homes)


def column_index(cols: Columns) -> dict[tuple[int, int, int], int]:
    """The column of each (job, type, GPUs)."""
    return {(int(cols.job[c]), int(cols.gpu_type[c]), int(cols.gpus[c])): c
            for c in range(len(cols.coeff))}


def _search(
    cols: Columns,
    opts: list[list[list[Option]]],
    index: dict[tuple[int, int, int], int],
    homes: Sequence[int],
) -> list[int]:
    current = list(homes)
    chosen = _settle(current, opts, cols)
    for _ in range(_ROUNDS):
        swapped = False
        while _swap(chosen, cols, index):
            swapped = True
        if not swapped:
            break
        for c in chosen:
            current[int(cols.job[c])] = int(cols.gpu_type[c])
        chosen = _settle(current, opts, cols)
    return chosen


def good_start(cols: Columns, sources: Sequence[Sequence[int]]) -> Floats:
    """The best :func:`search` result over the home ``sources``, as a 0/1
    column vector."""
    opts, index = cols.options(), column_index(cols)
    best: list[int] = []
    best_value = -np.inf
    for homes in sources:
        chosen = _search(cols, opts, index, homes)
        value = float(cols.coeff[chosen].sum()) if chosen else 0.0
        if value > best_value + _EPS:
            best, best_value = chosen, value
    start = np.zeros(len(cols.coeff))
    start[best] = 1.0
    return start


def lp_homes(cols: Columns, relaxed: Floats, reduced: Floats) -> tuple[list[int], list[int]]:
    """Two sources of homes from the LP relaxation: each job's type with the
    largest share of it (else that of its best reduced cost), and each job's
    type of best reduced cost."""
    types = len(cols.capacity)
    share = np.zeros((cols.jobs, types))
    np.add.at(share, (cols.job, cols.gpu_type), relaxed)
    best_rc = np.full((cols.jobs, types), -np.inf)
    np.maximum.at(best_rc, (cols.job, cols.gpu_type), reduced)
    has = np.isfinite(best_rc.max(axis=1))
    by_rc = np.where(has, best_rc.argmax(axis=1), -1)
    by_share = np.where(share.sum(axis=1) > _EPS, share.argmax(axis=1), by_rc)
    return [int(h) for h in by_share], [int(h) for h in by_rc]
