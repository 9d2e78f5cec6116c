"""Plan one round from files: the cluster, the jobs and their profiles.

This is the core on its own — no services, no clock: the profiles stand for
what the profiler would have measured, the estimator turns them into
estimates, and the policy (Hops by default) plans a first plan at ``now``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from estimation.database import ThroughputDatabase
from estimation.estimator import estimate_job
from scheduling.policy import Policy
from shared.cluster import Cluster
from shared.ids import GpuType
from shared.job import JobSpec
from shared.measurements import ProfileReport, TimeModules
from shared.snapshot import JobState, Plan, Snapshot
from shared.specs import SpecError, convert, load_cluster, load_jobs, read_document


class ModelProfile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Time modules of one model on one GPU type, as the profiler reports them."""

    model: str
    gpu_type: GpuType
    modules: TimeModules
    batch_size: int = 0


class ProfilesFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    profiles: tuple[ModelProfile, ...]


def load_profiles(path: str | Path) -> tuple[ModelProfile, ...]:
    p = Path(path)
    doc, lenient = read_document(p)
    return convert(doc, ProfilesFile, p.name, lenient).profiles


def profile_database(
    cluster: Cluster, jobs: tuple[JobSpec, ...], profiles: tuple[ModelProfile, ...]
) -> ThroughputDatabase:
    """A database holding one profiling run per job and GPU type (§3.2)."""
    by_key = {(p.model, p.gpu_type): p for p in profiles}
    db = ThroughputDatabase()
    for job in jobs:
        for gpu_type in cluster.type_by_name:
            prof = by_key.get((job.model, gpu_type))
            if prof is None:
                raise SpecError(f"no profile for model {job.model!r} on {gpu_type}")
            server = next(cluster.servers_of_type(gpu_type)).id
            db.record_profile(
                ProfileReport(job.id, gpu_type, server, prof.modules, prof.batch_size)
            )
    return db


def plan_once(
    cluster_path: str | Path,
    jobs_path: str | Path,
    profiles_path: str | Path,
    policy: Policy,
    now: float | None = None,
) -> tuple[Snapshot, Plan]:
    snap = load_snapshot(cluster_path, jobs_path, profiles_path, now)
    return snap, policy.plan(snap)


def load_snapshot(
    cluster_path: str | Path,
    jobs_path: str | Path,
    profiles_path: str | Path,
    now: float | None = None,
) -> Snapshot:
    """The snapshot of one round at ``now`` (default: the last submission):
    every job submitted by then queued, with estimates from its profiles."""
    cluster = load_cluster(cluster_path)
    jobs = load_jobs(jobs_path)
    db = profile_database(cluster, jobs, load_profiles(profiles_path))
    at = max(j.submit_time for j in jobs) if now is None else now
    states = tuple(
        JobState(spec=j, phase="queued", wait_s=max(0.0, at - j.submit_time))
        for j in jobs
        if j.submit_time <= at
    )
    estimates = {s.id: estimate_job(db, s.spec, cluster) for s in states}
    return Snapshot(now=at, cluster=cluster, jobs=states, estimates=estimates)


def render_plan(snap: Snapshot, result: Plan) -> str:
    """A human-readable plan: assignments in priority order, then the reasons."""
    r = result.reasons
    held = {a.job_id: a for a in result.assignments}
    lines = [
        f"cluster {snap.cluster.name}: {snap.cluster.total_gpus} GPUs on "
        f"{len(snap.cluster.servers)} servers; {len(snap.jobs)} jobs; policy {r.policy}",
        "",
        f"{'job':<22} {'priority':>9} {'gpus':>5} {'samples/s':>10}  configuration",
    ]
    for jid in sorted(r.priorities, key=lambda j: -r.priorities[j]):
        a = held.get(jid)
        where = str(a.config) if a else "waits"
        gpus = str(a.config.total_gpus) if a else "-"
        tput = f"{a.throughput:10.1f}" if a else f"{'-':>10}"
        lines.append(f"{jid:<22} {r.priorities[jid]:9.3f} {gpus:>5} {tput}  {where}")
    used = sum(a.config.total_gpus for a in result.assignments)
    lines += ["", f"GPUs used {used}/{snap.cluster.total_gpus}; window {len(r.window)} jobs"]
    if r.admitted_by_adjustment:
        lines.append(f"admitted by sensitivity adjustment: {', '.join(r.admitted_by_adjustment)}")
    for i, p in enumerate(r.passes):
        lines.append(
            f"pass {i} ({p.kind}, {p.formulation}): {p.jobs} jobs, {p.variables} columns, "
            f"objective {p.objective:.4f}, bound {p.bound:.4f}, gap {p.gap:.2%}, "
            f"{p.solve_s * 1000:.1f} ms, {p.status}"
        )
    return "\n".join(lines)
