"""Queue order among the plans Sia values equally (:mod:`.sia`).

The Hops paper runs Sia with its own latency-ratio queue (§4.2), but Sia's
objective has no job weights, so the queue can only decide where Sia is
indifferent. It does so after the solve, not inside the ILP: Sia's costs
are multiples of 0.01 (G^p rounded to two decimals, lambda = 1.1), and
HiGHS uses that grid to round its bound. Perturbing each job's columns by
its rank breaks the grid, and the solves then took twice as long
(docs/performance.md).

The exchange: an unserved job takes the allocation (GPU type and count) of
the lowest-ranked served job behind it in the queue whenever it values that
allocation at least as much. The GPUs used per type do not change, so the
plan stays feasible, and the objective cannot fall. Jobs are visited in
queue order, and a job that loses its allocation is visited later in turn,
so ties pass down the queue.
"""

from __future__ import annotations

import numpy as np

from scheduling.policies.sia.start import Columns, Floats, column_index

_EPS = 1e-9


def prefer_queue_order(cols: Columns, values: Floats) -> Floats:
    """``values`` (a 0/1 solution over ``cols``, whose job index is the queue
    rank, 0 first) after the exchanges of the module docstring."""
    index = column_index(cols)
    out = np.where(np.asarray(values) > 0.5, 1.0, 0.0)
    served = {int(cols.job[c]): int(c) for c in np.flatnonzero(out)}
    for job in range(cols.jobs):
        if job in served:
            continue
        for other in sorted((o for o in served if o > job), reverse=True):
            theirs = served[other]
            mine = index.get((job, int(cols.gpu_type[theirs]), int(cols.gpus[theirs])))
            if mine is not None and cols.coeff[mine] >= cols.coeff[theirs] - _EPS:
                out[theirs], out[mine] = 0.0, 1.0
                del served[other]
                served[job] = mine
                break
    return out
