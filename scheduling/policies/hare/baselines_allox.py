"""``allox``: Sched_Allox of hare.md §7.1 (AlloX, Le et al., EuroSys'20):
heterogeneity-aware, job-level, with no intra-job relaxation.

AlloX's matching
----------------
AlloX minimises the total completion time of the jobs present by a
minimum-cost bipartite matching of jobs to (machine, position) slots: job j
placed k-th from the end on machine m delays itself and the k-1 jobs after
it, so the slot costs ``k · p_{j,m}``; the matching is exact (the classic
reduction of unrelated-machine total completion time, Horn 1973 /
Bruno-Coffman-Sethi 1974). Here it is solved by the Hungarian method
(:mod:`.assignment`).

Machines and positions for multi-GPU jobs
-----------------------------------------
AlloX's machines run one single-resource job at a time; a Hare job needs S
GPUs at once. A *machine* here is the pool of one GPU type (c_t GPUs), and a
job's processing time on it is the GPU time it takes from the pool:
``q_{j,t} = S_j · p_{j,t} / c_t``, with ``p_{j,t}`` = remaining rounds times
the round time on type t (T^c + T^s): the pool seen as one machine that runs
jobs one after another at c_t GPUs' speed. A job may only match a pool that
can run it and has at least S_j GPUs (AlloX runs a job on one machine type).
Slot ``(t, k)`` costs ``k · q_{j,t}``, k = 1..n for the n jobs matched.

Realisation: per pool, its jobs go from the largest k (first) to k = 1
(last); each starts as soon as S of the pool's GPUs are free at or after
its release, on the first S free in GPU order, and keeps them for all its
rounds (:mod:`.joblevel`). Running jobs continue first, on the type where
they can resume earliest (their own GPUs'); AlloX does not preempt.

Departures, stated: the pool-as-machine cost above (AlloX has single-GPU
jobs); weights are ignored, as AlloX minimises the unweighted mean JCT;
arrivals later than ``now`` are not priced by the matching (AlloX matches
the jobs present; the simulator replans at each arrival) but are respected
when the plan is realised; AlloX's fairness knob (its ``α`` share of
starving jobs) is off.
"""

from __future__ import annotations

import numpy as np

from scheduling.policies.hare.assignment import min_cost_assignment
from scheduling.policies.hare.joblevel import Planner, in_order, round_time, started
from scheduling.policies.hare.model import Gpu, TaskJob, TaskProblem, TaskSchedule
from shared.ids import GpuType


def pools(problem: TaskProblem) -> dict[GpuType, list[Gpu]]:
    """The problem's GPUs by type, types in the order the GPUs first show them."""
    out: dict[GpuType, list[Gpu]] = {}
    for g in problem.gpus:
        out.setdefault(g.type, []).append(g)
    return out


def fits(job: TaskJob, gpu_type: GpuType, size: int) -> bool:
    return gpu_type in job.compute_s and size >= job.tasks_per_round


def matching(jobs: list[TaskJob], by_type: dict[GpuType, list[Gpu]]
             ) -> dict[GpuType, list[TaskJob]]:
    """AlloX's matching (module docstring): each pool's jobs, first to last."""
    types = list(by_type)
    n = len(jobs)
    if n == 0:
        return {t: [] for t in types}
    q = np.full((n, len(types)), np.nan)
    for i, job in enumerate(jobs):
        for k, t in enumerate(types):
            size = len(by_type[t])
            if fits(job, t, size):
                q[i, k] = job.tasks_per_round * job.remaining_rounds * round_time(job, t) / size
        if np.all(np.isnan(q[i])):
            raise ValueError(f"allox: no GPU type has {job.tasks_per_round} GPUs that can "
                             f"run job {job.id}")
    positions = np.arange(1, n + 1, dtype=np.float64)
    # Column t·n + (k-1) is slot (type t, k-th from the end).
    cost = (q[:, :, None] * positions[None, None, :]).reshape(n, len(types) * n)
    forbidden = np.isnan(cost)
    # Dearer than any whole assignment of allowed slots: never chosen.
    cost[forbidden] = 1.0 + n * float(np.nanmax(cost, initial=0.0)) * 2.0
    chosen = min_cost_assignment(cost)
    slots: dict[GpuType, list[tuple[int, TaskJob]]] = {t: [] for t in types}
    for job, col in zip(jobs, chosen, strict=True):
        slots[types[col // n]].append((col % n + 1, job))
    return {t: [job for _, job in sorted(s, key=lambda kj: -kj[0])] for t, s in slots.items()}


class Allox:
    """``allox``: see the module docstring for the rule and its departures."""

    name = "allox"

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        plan = Planner(problem)
        by_type = pools(problem)
        order = list(by_type)
        running = sorted((j for j in plan.jobs() if started(problem, j)),
                         key=lambda j: (plan.release(j), j.id))
        for job in running:
            options = [(plan.earliest(job, plan.release(job), gpus), round_time(job, t),
                        order.index(t)) for t, gpus in by_type.items()
                       if fits(job, t, len(gpus))]
            if not options:
                raise ValueError(f"allox: no GPU type has {job.tasks_per_round} GPUs that "
                                 f"can run job {job.id}")
            t = order[min(options)[2]]
            plan.place_now(job, plan.release(job), in_order, among=by_type[t])
        waiting = sorted((j for j in plan.jobs() if not started(problem, j)),
                         key=lambda j: (j.arrival_s, j.id))
        for t, jobs in matching(waiting, by_type).items():
            for job in jobs:
                plan.place_now(job, plan.release(job), in_order, among=by_type[t])
        return TaskSchedule(tuple(plan.tasks))
