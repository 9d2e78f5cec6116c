"""Exact minimum-cost assignment (the Hungarian method) for AlloX's matching
(:mod:`.baselines_allox`).

The shortest-augmenting-path form with potentials (Kuhn-Munkres as refined
by Jonker and Volgenant): rows are added one at a time and each is matched
along a shortest alternating path under reduced costs, O(n² m) for n rows and
m >= n columns; the column sweeps are numpy vector operations. Ties go to the
lowest column index (``argmin``), so the result is deterministic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float64]


def min_cost_assignment(cost: Matrix) -> list[int]:
    """The column of each row in an assignment of every row to its own
    column that minimises the total cost (needs rows <= columns; every entry
    finite: price forbidden pairs high instead)."""
    n, m = cost.shape
    if n > m:
        raise ValueError(f"assignment: {n} rows but only {m} columns")
    if not np.all(np.isfinite(cost)):
        raise ValueError("assignment: costs must be finite")
    # 1-based as in the textbook form: column 0 and row 0 are the virtual start.
    a = np.zeros((n + 1, m + 1))
    a[1:, 1:] = cost
    u = np.zeros(n + 1)
    v = np.zeros(m + 1)
    owner = np.zeros(m + 1, dtype=np.int64)  # row matched to each column, 0 = none
    way = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        owner[0] = i
        j0 = 0
        minv = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = owner[j0]
            free = ~used
            cur = a[i0] - u[i0] - v
            better = free & (cur < minv)
            minv[better] = cur[better]
            way[better] = j0
            masked = np.where(free, minv, np.inf)
            j1 = int(np.argmin(masked))
            delta = masked[j1]
            u[owner[used]] += delta
            v[used] -= delta
            minv[free] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:
            j1 = int(way[j0])
            owner[j0] = owner[j1]
            j0 = j1
    out = [0] * n
    for j in range(1, m + 1):
        if owner[j]:
            out[int(owner[j]) - 1] = j - 1
    return out
