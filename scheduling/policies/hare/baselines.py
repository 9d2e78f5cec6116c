"""Three of the baselines of hare.md §7.1, job-level and scale-fixed strict
(:mod:`.joblevel`): ``gavel-fifo``, ``srtf`` and ``homo`` (Sched_Homo). The
fourth, ``allox``, is in :mod:`.baselines_allox`.

Each plans every remaining task of the problem in one pass, deterministically
(ties by arrival, then job id, then GPU order). The plan is job-level: a job
holds its S GPUs from its start to its last round. Online behaviour comes
from the simulator (:mod:`simulator.tasks`), which calls ``schedule`` again at
every arrival with the rounds not yet under way: a baseline may then move
a job's *later* rounds, which is how SRTF preempts; the non-preemptive
ones place running jobs first (:meth:`.joblevel.Planner.place_started`).
None of them plans the switch cost: they never share a GPU between jobs
within a job's run, so it is paid once per job start at most.
"""

from __future__ import annotations

import statistics

from scheduling.policies.hare.checks import usable_types
from scheduling.policies.hare.joblevel import Planner, fastest, in_order, round_time
from scheduling.policies.hare.model import TaskJob, TaskProblem, TaskSchedule


class GavelFifo:
    """``gavel-fifo``: Gavel's heterogeneity-aware FIFO (hare.md §7.1, Gavel
    OSDI'20 §4).

    Rule: jobs in arrival order (then id). Job k starts at the earliest time
    at or after its release, and at or after the start of job k-1 (strict
    FIFO: head-of-line blocking, no backfilling), when S GPUs able to run it
    are free at once; it takes the S fastest of the GPUs free then (least
    T^c + T^s for it, ties by GPU order) and keeps them for all its rounds.
    On a replan, the jobs already running (all of them ahead of every
    waiting one in FIFO order) resume first, and the head-of-line rule
    applies among the waiting jobs.

    Departures from Gavel: Gavel allocates in rounds of a few minutes and
    may move a job between rounds; here a job keeps its GPUs (the paper's
    "scale-fixed" reading, §2.2.3) unless an online replan moves its later
    rounds, which FIFO's order makes rare. Gavel's FIFO policy assigns
    throughput-normalised time shares; this is the "fastest available GPUs"
    rule hare.md §7.1 describes.
    """

    name = "gavel-fifo"

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        plan = Planner(problem)
        waiting = plan.place_started(fastest)
        floor = -float("inf")
        for job in sorted(waiting, key=lambda j: (j.arrival_s, j.id)):
            floor = plan.place_now(job, max(plan.release(job), floor), fastest)
        return TaskSchedule(tuple(plan.tasks))


def best_round_time(problem: TaskProblem, job: TaskJob) -> float:
    """The shortest round of ``job`` on any type of the problem that can run it."""
    return min(round_time(job, t) for t in usable_types(problem, job))


class Srtf:
    """``srtf``: shortest remaining time first (hare.md §7.1), job-level.

    Rule: a job's remaining time is its remaining rounds times its best round
    time (T^c + T^s on its fastest type: the time it needs if it gets those
    GPUs). Work-conserving list scheduling: at each moment, of the jobs
    released with S able GPUs free, the one of least remaining time (then
    arrival, id) starts on the S fastest free GPUs and keeps them for all its
    rounds; a job that does not fit does not block those behind it, as in
    Gavel's and Tiresias' greedy allocation in priority order.

    Preemption: none within a plan. At every arrival the simulator replans
    the rounds not yet started, so a newcomer with less remaining time takes
    GPUs at the next round boundary of a running job: SRTF's preemption at
    task granularity, without a checkpoint cost beyond the switch.
    """

    name = "srtf"

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        plan = Planner(problem)

        def remaining(job: TaskJob) -> tuple[float, ...]:
            return (job.remaining_rounds * best_round_time(problem, job), job.arrival_s)

        plan.list_schedule(sorted(plan.jobs(), key=lambda j: j.id), remaining, fastest)
        return TaskSchedule(tuple(plan.tasks))


def mean_round_time(problem: TaskProblem, job: TaskJob) -> float:
    """Sched_Homo's view of one round: the mean over the problem's GPU types
    able to run the job of T^c, plus the mean of T^s (one time per job)."""
    types = usable_types(problem, job)
    return (statistics.fmean(job.compute_s[t] for t in types)
            + statistics.fmean(job.sync(t) for t in types))


class Homo:
    """``homo``: Sched_Homo (Zhang et al., hare.md ref. [47], §7.1), the
    heterogeneity-oblivious scheduler that minimises weighted JCT.

    Rule: every GPU is taken to run at the mean speed, so a job has one round
    time, :func:`mean_round_time`, and a processing time ``p`` = remaining
    rounds times it. Running jobs continue first (no job-level preemption,
    §7.1). The others are list-scheduled work-conservingly in Smith's order,
    largest ``w / p`` first (weighted shortest processing time, then arrival,
    id); a job gets the first S free GPUs in the cluster's order, since all
    look the same to it, and keeps them (the experiment's clusters spread
    each type evenly over that order, :func:`experiments.hare.workload.
    cluster_gpus`, so the order favours no type). The plan's times are the
    GPUs' real ones: only the decisions are oblivious.

    Departures from [47]: its online algorithm also chooses how many GPUs a
    job gets; here the job's sync scale S is fixed (scale-fixed, as every
    scheduler of hare.md §7 is compared), so Smith's rule on the homogeneous
    view is what remains of its ordering.
    """

    name = "homo"

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        plan = Planner(problem)
        waiting = plan.place_started(in_order)

        def smith(job: TaskJob) -> tuple[float, ...]:
            p = job.remaining_rounds * mean_round_time(problem, job)
            return (-job.weight / p, job.arrival_s)

        plan.list_schedule(sorted(waiting, key=lambda j: j.id), smith, in_order)
        return TaskSchedule(tuple(plan.tasks))
