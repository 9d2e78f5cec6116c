"""Queue priorities (Hops §3.6): latency ratio by default, and the classic
orders the paper compares against in §4.5 (LAS, SJF, SRTF, FIFO) plus
Themis' finish-time fairness (§4.4).

Every priority maps a job's facts to a number; higher runs first. They may be
negative: the planner's bias rule (Eq. 11) makes the weights positive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeVar

import msgspec

from scheduling.rounds import ROUND_S
from shared.cluster import Cluster
from shared.estimate import JobEstimate, age
from shared.ids import JobId
from shared.snapshot import JobState, Snapshot


class JobFacts(msgspec.Struct, frozen=True):
    """What priorities read about a job, computed once per planning call."""

    age_s: float  # Eq. (9)
    remaining_s: float  # age scaled by the fraction of samples still to do
    isolated_s: float  # Themis' T_id: run time on an equal share of the cluster
    elapsed_s: float  # now - submission


K = TypeVar("K")

PriorityFn = Callable[[JobState, JobFacts], float]


def job_facts(
    job: JobState,
    est: JobEstimate,
    cluster: Cluster,
    now: float,
    r_num: int,
    active_jobs: int,
) -> JobFacts:
    reqs = job.spec.requirement_set(r_num)
    r_avg = sum(reqs) / len(reqs)
    age_s = age(est, cluster, job.spec.total_samples, r_avg)
    frac_left = job.remaining_samples / job.spec.total_samples
    # Equal share of the cluster, bounded by what the job can use (Themis, Sia).
    share = min(max(reqs), max(1.0, cluster.total_gpus / max(1, active_jobs)))
    isolated = age_s * r_avg / share if math.isfinite(age_s) else math.inf
    return JobFacts(
        age_s=age_s,
        remaining_s=age_s * frac_left,
        isolated_s=isolated,
        elapsed_s=max(0.0, now - job.spec.submit_time),
    )


def queue_priorities(
    snapshot: Snapshot,
    jobs: Mapping[JobId, JobState],
    priority: PriorityFn,
    r_num: int,
    estimates: Mapping[JobId, JobEstimate] | None = None,
) -> dict[JobId, float]:
    """Each job's priority at ``snapshot.now``; every policy queues with this,
    so the baselines order jobs exactly as Hops does (§4.2)."""
    facts = queue_facts(snapshot, jobs, r_num, estimates)
    return {jid: priority(job, facts[jid]) for jid, job in jobs.items()}


def queue_facts(
    snapshot: Snapshot,
    jobs: Mapping[JobId, JobState],
    r_num: int,
    estimates: Mapping[JobId, JobEstimate] | None = None,
) -> dict[JobId, JobFacts]:
    """Each job's :class:`JobFacts` at ``snapshot.now``, what every priority
    rule of :func:`queue_priorities` reads."""
    ests = snapshot.estimates if estimates is None else estimates
    active = sum(1 for j in snapshot.jobs if j.phase != "profiling") or 1
    return {
        jid: job_facts(job, ests[jid], snapshot.cluster, snapshot.now, r_num, active)
        for jid, job in jobs.items()
    }


def latency_ratios(
    snapshot: Snapshot,
    jobs: Mapping[JobId, JobState],
    r_num: int,
    estimates: Mapping[JobId, JobEstimate] | None = None,
) -> dict[JobId, float]:
    """Each job's latency ratio at ``snapshot.now``, for the plan's reasons."""
    return queue_priorities(snapshot, jobs, latency_ratio, r_num, estimates)


def latency_ratio(job: JobState, facts: JobFacts) -> float:
    """Eq. (6)/(8): wait_i / age_i."""
    if not math.isfinite(facts.age_s) or facts.age_s <= 0:
        return 0.0
    return job.wait_s / facts.age_s


def finish_time_fairness(job: JobState, facts: JobFacts) -> float:
    """Themis' rho = T_sh / T_id, with T_sh projected as elapsed + remaining."""
    if not math.isfinite(facts.isolated_s) or facts.isolated_s <= 0:
        return 0.0
    return (facts.elapsed_s + facts.remaining_s) / facts.isolated_s


def least_attained_service(job: JobState, facts: JobFacts) -> float:
    """LAS: the least GPU-seconds received so far runs first."""
    return -job.attained_gpu_s


def shortest_job_first(job: JobState, facts: JobFacts) -> float:
    """SJF on the expected run time (Eq. 9)."""
    return -facts.age_s


def shortest_remaining_first(job: JobState, facts: JobFacts) -> float:
    """SRTF on the expected remaining run time."""
    return -facts.remaining_s


def first_in_first_out(job: JobState, facts: JobFacts) -> float:
    return -job.spec.submit_time


# A job that has waited as long as its own run time (LR 1) is served first.
LR_GUARD = 1.0


def guarded_srtf(job: JobState, facts: JobFacts) -> float:
    """SRTF, with the latency ratio as a guard (this project's option, not
    the paper's): a job whose Eq. (8) latency ratio reached :data:`LR_GUARD`
    goes before every other, by its latency ratio; the rest by remaining
    run time. Average JCT as SRTF gives it, while no job waits longer than
    its own run time for long (the bound was fixed before any run)."""
    lr = latency_ratio(job, facts)
    if lr >= LR_GUARD:
        return lr
    return -facts.remaining_s


def guarded_delay(job: JobState, facts: JobFacts) -> float:
    """:func:`guarded_srtf` on one scale (this project's option): below the
    guard, the share of its remaining JCT that one more round of waiting
    costs a job, ``round / (round + remaining)``, which orders as SRTF does
    and lies in (0, 1]; a guarded job keeps its latency ratio (>= 1). The
    ILP weighs jobs by these priorities (Eq. 11): with SRTF's ``-remaining``
    a guarded job weighed about as much as any short one, so a wide job
    past its guard still lost its GPUs to several narrow ones."""
    lr = latency_ratio(job, facts)
    if lr >= LR_GUARD:
        return lr
    return ROUND_S / (ROUND_S + max(0.0, facts.remaining_s))


PRIORITIES: Mapping[str, PriorityFn] = {
    "lr": latency_ratio,
    "ftf": finish_time_fairness,
    "las": least_attained_service,
    "sjf": shortest_job_first,
    "srtf": shortest_remaining_first,
    "fifo": first_in_first_out,
    "guarded-srtf": guarded_srtf,
    "guarded-delay": guarded_delay,
}


def priority_fn(name: str) -> PriorityFn:
    try:
        return PRIORITIES[name]
    except KeyError:
        known = ", ".join(sorted(PRIORITIES))
        raise ValueError(f"unknown priority {name!r}; known: {known}") from None


def weights(priorities: Mapping[K, float], lam: float) -> dict[K, float]:
    """Eq. (11)'s (prior_i + bias)^lambda with the paper's bias rule.

    bias = 0 when every priority is positive, else |min prior| + 0.01 so the
    lowest job keeps a non-zero weight. lambda = 0 gives all weights 1.
    The weights are divided by the largest one, which leaves the argmax of
    Eq. (11) unchanged and keeps a large lambda from overflowing.
    """
    if not priorities:
        return {}
    low = min(priorities.values())
    bias = 0.0 if low > 0 else abs(low) + 0.01
    top = max(priorities.values()) + bias
    return {k: ((p + bias) / top) ** lam for k, p in priorities.items()}
