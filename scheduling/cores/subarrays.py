"""The GPU sub-arrays of CODA's multi-array scheme (Zhao et al. ICDCS'20,
§V-C): the core layer (:mod:`.layer`) plans GPU jobs of ``large_job_gpus``
or more on the large sub-array first, the others on the small one, and
what neither placed overflows onto every GPU left.

The large sub-array is the first servers, in cluster order, that hold the
most GPUs large jobs have held at once (``CoreState.large_gpus``, kept
from plan to plan).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from scheduling.layers.base import hold, hold_back, merge_reasons
from scheduling.policy import Policy
from shared.cluster import Server
from shared.ids import JobId, ServerId
from shared.snapshot import JobState, Plan, Snapshot


def plan_subarrays(inner: Policy, view: Snapshot, servers: Sequence[Server],
                   gpu_jobs: Sequence[JobState], large_gpus: int,
                   large_job_gpus: int) -> tuple[Plan, int]:
    """``inner``'s plans of ``view`` on the sub-arrays, merged, and the large
    sub-array's new size in GPUs (``large_gpus``: its size so far)."""
    large = {j.id for j in gpu_jobs
             if max(j.spec.requirement_set(), default=0) >= large_job_gpus}
    large_gpus = max(large_gpus, _large_running(gpu_jobs, large))
    big = _large_servers(servers, large_gpus)
    small = {s.id for s in servers} - big
    everyone = {j.id for j in view.jobs}
    plans: list[Plan] = []
    taken: Counter[ServerId] = Counter()
    placed: set[JobId] = set()
    for jobs, where in ((large, big), (everyone - large, small),
                        (everyone, {s.id for s in servers})):
        jobs = set(jobs) - placed
        if not jobs or not where:
            continue
        others = {s.id: s.gpus for s in servers if s.id not in where}
        part = hold_back(hold(hold(view, taken), others), everyone - jobs)
        plan = inner.plan(part)
        plans.append(plan)
        for a in plan.assignments:
            placed.add(a.job_id)
            taken.update(a.config.as_dict())
        for t in plan.profiling:
            taken[t.server] += t.gpus
    merged = Plan(tuple(a for p in plans for a in p.assignments),
                  tuple(t for p in plans for t in p.profiling),
                  merge_reasons([p.reasons for p in plans], inner.name))
    return merged, large_gpus


def _large_servers(servers: Sequence[Server], large_gpus: int) -> set[ServerId]:
    """The first servers that hold ``large_gpus`` GPUs."""
    big: set[ServerId] = set()
    room = large_gpus
    for s in servers:
        if room <= 0:
            break
        big.add(s.id)
        room -= s.gpus
    return big


def _large_running(gpu_jobs: Sequence[JobState], large: set[JobId]) -> int:
    return sum(j.current.total_gpus for j in gpu_jobs
               if j.id in large and j.phase == "running" and j.current is not None)
