"""Jobs the forecast expects to arrive (docs/explain.md, "Forecasts").

Under the latency-ratio queue (Eq. 8) a job that arrives later overtakes
one that waits once its own ratio is the higher, so a model that knows only
today's queue forecasts the back of the queue too early. The model is given
the arrivals of the last :data:`WINDOW_S` again, one window after another,
over the rounds it replans: the recent arrival rate and mix, as measured,
with no constant fitted to any trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scheduling.forecast.model import Model, Waiting
from shared.snapshot import JobState

# The recent past whose arrivals are expected again: an hour.
WINDOW_S = 3600.0
# At most as many expected arrivals as jobs in the snapshot, the nearest
# first: a forecast's cost at most doubles (the budget).
PER_JOB = 1


def with_arrivals(model: Model, jobs: Sequence[JobState], specs: Sequence[Waiting | None],
                  window_s: float = WINDOW_S) -> Model:
    """``model`` with the jobs submitted in the last ``window_s`` arriving
    again every ``window_s`` until its last replanned round; ``specs[i]``
    is how job i waits (None: not modelled). Only where the policy ranks
    by the latency ratio (``model.aging``), the only order in which a
    newcomer's place is known."""
    if not model.aging:
        return model
    now = model.now
    horizon = now + model.replan_rounds * model.round_s
    recent = [(j.spec.submit_time, i) for i, j in enumerate(jobs)
              if now - window_s < j.spec.submit_time <= now and specs[i] is not None
              and i in model.aging]
    extra: list[Waiting] = []
    aging = dict(model.aging)
    rank = dict(model.rank)
    n = len(jobs)
    for k in range(1, int((horizon - now) // window_s) + 2):
        for submit, i in sorted(recent):
            at = submit + k * window_s
            spec = specs[i]
            if at > horizon or spec is None or len(extra) >= PER_JOB * len(jobs):
                continue
            extra.append(dataclasses.replace(
                spec, job=n, remaining=float(jobs[i].spec.total_samples),
                eligible_at=at + (spec.eligible_at - now)))
            aging[n] = (model.aging[i][0], 0.0)
            rank[n] = n
            n += 1
    if not extra:
        return model
    return dataclasses.replace(model, waiting=(*model.waiting, *extra), aging=aging, rank=rank)
