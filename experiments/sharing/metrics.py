"""Per-tenant measures of the sharing experiment (issue 20; HiveD §2, §5.2).

A job is **anomalous** (the sharing anomaly of §2, job by job) when it waited
more than one round longer in the shared cluster than the same job in its
tenant's private cluster (a cluster of exactly the tenant's cells); its
excess wait is the difference. Cluster utilisation and the fragmentation
level (§5.2: the proportion of 8-GPU node cells that cannot host a
node-sized guaranteed job) come from the rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from experiments.sharing.cluster import busy_nodes
from shared.ids import JobId
from simulator.engine import Simulation
from simulator.metrics import JobOutcome, RoundRecord


class TenantMetrics(msgspec.Struct, frozen=True):
    """The keys of ``results.json``'s ``tenants`` entries."""

    jobs: int
    avg_wait_h: float
    avg_jct_h: float
    anomalous_jobs: int
    max_excess_wait_h: float


def excess_waits(outcomes: Sequence[JobOutcome],
                 private: Mapping[JobId, JobOutcome]) -> dict[JobId, float]:
    """Each job's wait minus its wait in ``private`` (seconds), for the jobs
    in both runs."""
    return {j.id: j.wait_s - private[j.id].wait_s for j in outcomes if j.id in private}


def tenant_metrics(outcomes: Sequence[JobOutcome], tenant_of: Mapping[JobId, str],
                   private: Mapping[JobId, JobOutcome], round_s: float
                   ) -> dict[str, TenantMetrics]:
    """Per tenant: jobs, average wait and JCT (hours, over its finished
    jobs), the jobs that waited more than ``round_s`` longer than in
    ``private`` and the largest excess wait (hours, 0 when none is longer)."""
    groups: dict[str, list[JobOutcome]] = {}
    for j in outcomes:
        groups.setdefault(tenant_of[j.id], []).append(j)
    excess = excess_waits(outcomes, private)
    out: dict[str, TenantMetrics] = {}
    for tenant in sorted(groups):
        jobs = groups[tenant]
        done = [j for j in jobs if j.jct_s is not None]
        extra = [excess[j.id] for j in jobs if j.id in excess]
        out[tenant] = TenantMetrics(
            jobs=len(jobs),
            avg_wait_h=sum(j.wait_s for j in done) / len(done) / 3600 if done else 0.0,
            avg_jct_h=sum(j.jct_s or 0.0 for j in done) / len(done) / 3600 if done else 0.0,
            anomalous_jobs=sum(1 for e in extra if e > round_s),
            max_excess_wait_h=max(0.0, *extra) / 3600 if extra else 0.0,
        )
    return out


def _busy_rounds(rounds: Sequence[RoundRecord], jobs: Sequence[JobOutcome]) -> list[RoundRecord]:
    last = max((j.finish for j in jobs if j.finish is not None), default=0.0)
    return [r for r in rounds if r.t <= last]


def utilisation(rounds: Sequence[RoundRecord], jobs: Sequence[JobOutcome],
                total_gpus: int) -> float:
    """Mean share of GPUs in use at the rounds up to the last completion."""
    busy = _busy_rounds(rounds, jobs)
    if not busy or total_gpus <= 0:
        return 0.0
    return sum((total_gpus - r.idle) / total_gpus for r in busy) / len(busy)


class FragmentedSimulation(Simulation):
    """The engine, also recording at each round's first plan the fragmentation
    level of §5.2: the share of node cells with any GPU in use (jobs or
    profiling), which therefore cannot host a node-sized job."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fragmentation: list[tuple[float, float]] = []

    def _round(self) -> None:
        super()._round()
        used = dict(self.occ.jobs)
        for sid, g in self.occ.profiling.items():
            used[sid] = used.get(sid, 0) + g
        servers = self.cluster.servers
        self.fragmentation.append((self.now, busy_nodes(servers, used) / len(servers)))
