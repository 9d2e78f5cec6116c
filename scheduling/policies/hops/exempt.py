"""Preemption exemption: a job that has just (re)started keeps its GPUs at
a first plan until it has run long enough to pay for its restart. This
project's option (``HopsSettings.preempt_exempt``), not the paper's: Slurm
has the same rule as ``PreemptExemptTime``.

Hops replans every running job at each round's first plan (§3.6), and under
the latency-ratio priority a waiting job's priority keeps rising while a
running one's does not, so jobs trade places round after round. Each trade
is a checkpoint-restart (an ImageNet model's 250 s of a 300 s round,
world/restarts.py). A job whose current configuration began less than
``preempt_exempt`` times its restart cost ago is kept where it is: its GPUs
are held from the plan and its assignment is its current configuration.
With the default 10, a restart costs a job at most a tenth of the time it
then runs before it can be moved again (the rule was fixed before any run).

``HopsSettings.finish_exempt`` (issue 38, off by default) also keeps a
running job whose estimated remaining time at its current configuration is
below what a preemption would cost it: its restart cost plus a round
(:data:`~scheduling.rounds.ROUND_S`), its wait until the next first plan
unless a fill plan finds it GPUs sooner. Preempting such a job delays it by
more than each waiting job that takes its GPUs gains: that job gets them
at its end, within the round, from a fill plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from scheduling.layers.base import hold, hold_back
from scheduling.rounds import ROUND_S, restart_cost
from shared.estimate import config_throughput
from shared.ids import ServerId
from shared.snapshot import Assignment, JobState, Snapshot


def exempt(snapshot: Snapshot, multiple: float, finish: bool = False) -> tuple[JobState, ...]:
    """Running jobs within their exemption (first plans only; none at 0
    without ``finish``) whose GPUs the plan may still give them: a GPU that
    a layer outside took (profiling that preempts, a server gone) ends the
    exemption. ``finish``: jobs that end sooner than a preemption would cost
    them are exempt too (:func:`finishing`)."""
    if (multiple <= 0 and not finish) or not snapshot.first_plan:
        return ()
    free = Counter(snapshot.free_gpus())
    out: list[JobState] = []
    for j in snapshot.jobs:
        if j.phase != "running" or j.current is None or not j.current.total_gpus:
            continue
        recent = (multiple > 0 and j.throughput_since > 0
                  and snapshot.now - j.throughput_since < multiple * restart_cost(j))
        if not (recent or (finish and finishing(snapshot, j))):
            continue
        parts = dict(j.current.parts)
        if all(free[s] >= g for s, g in parts.items()):
            free.subtract(parts)
            out.append(j)
    return tuple(out)


def finishing(snapshot: Snapshot, job: JobState) -> bool:
    """Whether a running job's estimated remaining time at its current
    configuration is below a preemption's cost to it: its restart plus a
    round's wait for GPUs again (a job without an estimate: no)."""
    est = snapshot.estimates.get(job.id)
    if est is None or job.current is None:
        return False
    rate = config_throughput(est, snapshot.cluster, job.current)
    return rate > 0 and job.remaining_samples / rate < restart_cost(job) + ROUND_S


def without_exempt(snapshot: Snapshot, jobs: Sequence[JobState]) -> Snapshot:
    """The snapshot the planner sees: the exempt jobs gone, their GPUs held."""
    if not jobs:
        return snapshot
    gpus: Counter[ServerId] = Counter()
    for j in jobs:
        assert j.current is not None
        gpus.update(dict(j.current.parts))
    return hold_back(hold(snapshot, gpus), {j.id for j in jobs})


def kept(snapshot: Snapshot, jobs: Sequence[JobState]) -> list[Assignment]:
    """The exempt jobs' assignments: where they run, at the estimated speed."""
    out: list[Assignment] = []
    for j in jobs:
        assert j.current is not None
        est = snapshot.estimates.get(j.id)
        speed = config_throughput(est, snapshot.cluster, j.current) if est is not None else 0.0
        out.append(Assignment(j.id, j.current, speed))
    return out
