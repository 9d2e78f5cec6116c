"""What a task-level run (:mod:`simulator.tasks`) reports: per job its JCT,
and the measures of hare.md §7 (total weighted JCT, Figs. 12 and 14-19; the
share of jobs done within 25 minutes, Fig. 13's reading; the makespan, §1)."""

from __future__ import annotations

import statistics

import msgspec

from scheduling.policies.hare.model import GpuId
from shared.ids import JobId

FAST_S = 25 * 60.0  # Fig. 13: "about 90.5% of jobs can complete within 25 minutes"


class RunTask(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One executed macro-task: slot ``index`` of real rounds
    ``first_round .. first_round + rounds - 1`` of ``job`` on ``gpu``; the GPU
    is busy ``[start_s, end_s)`` (``switch_s`` of it switching) and the task
    is done, synchronised, at ``done_s``."""

    job: JobId
    first_round: int
    rounds: int
    index: int
    gpu: GpuId
    start_s: float
    end_s: float
    done_s: float
    switch_s: float


class JobOutcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: JobId
    arrival_s: float
    finish_s: float
    weight: float
    tasks: int  # real tasks run: rounds x tasks per round

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s


class TaskSimResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A run's outcome. ``weighted_jct_h``: Σ w (C - a) in hours;
    ``plan_s``: the policy's planning time per call (seconds, the injected
    timer's)."""

    policy: str
    jobs: tuple[JobOutcome, ...]
    weighted_jct_h: float
    avg_jct_h: float
    makespan_h: float
    share_done_25min: float
    plan_s: tuple[float, ...]
    tasks: tuple[RunTask, ...] = ()

    @property
    def plan_total_s(self) -> float:
        return sum(self.plan_s)

    def metrics(self) -> dict[str, float]:
        """The figures ``hops experiment hare`` reports per run."""
        return {
            "weighted_jct_h": self.weighted_jct_h,
            "avg_jct_h": self.avg_jct_h,
            "makespan_h": self.makespan_h,
            "share_done_25min": self.share_done_25min,
            "plan_total_s": self.plan_total_s,
            "plan_max_s": max(self.plan_s, default=0.0),
            "plans": float(len(self.plan_s)),
        }


def summarise(policy: str, jobs: tuple[JobOutcome, ...], plan_s: tuple[float, ...],
              tasks: tuple[RunTask, ...] = ()) -> TaskSimResult:
    """The result of a run whose jobs all finished."""
    if not jobs:
        return TaskSimResult(policy, jobs, 0.0, 0.0, 0.0, 0.0, plan_s, tasks)
    span = max(j.finish_s for j in jobs) - min(j.arrival_s for j in jobs)
    return TaskSimResult(
        policy=policy,
        jobs=jobs,
        weighted_jct_h=sum(j.weight * j.jct_s for j in jobs) / 3600.0,
        avg_jct_h=statistics.fmean(j.jct_s for j in jobs) / 3600.0,
        makespan_h=span / 3600.0,
        share_done_25min=sum(1 for j in jobs if j.jct_s <= FAST_S) / len(jobs),
        plan_s=plan_s,
        tasks=tasks,
    )
