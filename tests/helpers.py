"""Small builders shared by the tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import strategies as st

from cli.up.launcher import free_port  # noqa: F401  (the tests' name for it)
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.snapshot import JobState, Phase, Plan, Snapshot
from world.catalog import builtin_catalog


def catalog_spec(
    job_id: str, total: int, model: str = "resnet18-cifar10", **gpus: Any
) -> dict[str, Any]:
    """The JSON of a job of a model the emulated cluster knows
    (``world/catalog.py``), as a client submits it; ``gpus`` is its
    ``requirements`` or its ``min_gpus`` and ``max_gpus``."""
    truth = builtin_catalog()[model]
    return {"id": job_id, "model": model, "batch_size": truth.batch_size,
            "params": truth.params, "total_samples": total, **gpus}


def cluster(layout: Sequence[tuple[str, int, int]]) -> Cluster:
    """``[(type, servers, gpus_per_server), ...]`` → servers named ``{type}-{n}``."""
    types = tuple(
        GpuTypeSpec(GpuType(t), link_bandwidth=2.5e9, net_bandwidth=1e9)
        for t in dict.fromkeys(t for t, _, _ in layout)
    )
    servers: list[Server] = []
    for t, count, gpus in layout:
        start = sum(1 for s in servers if s.gpu_type == t)
        servers += [
            Server(ServerId(f"{t}-{start + n}"), GpuType(t), gpus) for n in range(count)
        ]
    return Cluster(gpu_types=types, servers=tuple(servers))


def flat_estimate(
    job_id: str,
    per_gpu: dict[str, float],
    rho: float = 1.0,
    max_gpus: int = 8,
    scaling: float = 0.95,
) -> JobEstimate:
    """Per-GPU throughput ``per_gpu[type]`` on one GPU, falling by ``scaling``
    per doubling, and ``1/rho`` of the one-GPU value across servers."""
    curves = {}
    for t, base in per_gpu.items():
        agg = tuple(base * scaling ** (k.bit_length() - 1) for k in range(1, max_gpus + 1))
        dist = tuple(base / rho for _ in range(15))
        curves[GpuType(t)] = ThroughputCurve(agg=agg, dist=dist)
    return JobEstimate(job_id=JobId(job_id), by_type=curves)


def state(
    job_id: str,
    requirements: Sequence[int],
    *,
    wait_s: float = 0.0,
    submit: float = 0.0,
    samples: int = 1_000_000,
    phase: Phase = "queued",
    unprofiled: Sequence[str] = (),
) -> JobState:
    spec = JobSpec(
        id=JobId(job_id),
        model="m",
        batch_size=32,
        params=10_000_000,
        total_samples=samples,
        requirements=tuple(requirements),
        submit_time=submit,
    )
    return JobState(
        spec=spec,
        phase=phase,
        wait_s=wait_s,
        unprofiled=tuple(GpuType(t) for t in unprofiled),
    )


def held_by(jobs: Sequence[JobState]) -> dict[ServerId, int]:
    """The GPUs the jobs' current configurations hold (a later plan's ``held``)."""
    held: dict[ServerId, int] = {}
    for j in jobs:
        for s, g in (j.current.parts if j.current is not None else ()):
            held[s] = held.get(s, 0) + g
    return held


def used(plan: Plan) -> Counter[str]:
    """GPUs a plan takes per server, profiling runs included."""
    total: Counter[str] = Counter()
    for a in plan.assignments:
        for sid, g in a.config.parts:
            total[sid] += g
    for t in plan.profiling:
        total[t.server] += t.gpus
    return total


def untimed(plan: Plan) -> Plan:
    """The plan without the solver's wall time, which no input determines."""
    passes = tuple(msgspec.structs.replace(p, solve_s=0.0) for p in plan.reasons.passes)
    return msgspec.structs.replace(
        plan, reasons=msgspec.structs.replace(plan.reasons, passes=passes)
    )


def assert_feasible(plan: Plan, snap: Snapshot) -> None:
    """The invariants every policy keeps: no server over-allocated (profiling
    included), at most one configuration per job, each from its requirement
    set, and profiling only for jobs that need it."""
    free = snap.free_gpus()
    for sid, gpus in used(plan).items():
        assert gpus <= free[ServerId(sid)], (sid, gpus, free)
    ids = [a.job_id for a in plan.assignments]
    assert len(ids) == len(set(ids))
    by_id = {j.id: j for j in snap.jobs}
    for a in plan.assignments:
        assert a.config.total_gpus in by_id[a.job_id].spec.requirement_set()
    for t in plan.profiling:
        assert by_id[t.job_id].phase == "profiling"


# Cluster layouts for property tests: up to three types of 1-3 servers each.
layouts = st.lists(
    st.tuples(st.sampled_from(["A", "B", "C"]), st.integers(1, 3), st.sampled_from([2, 4, 8])),
    min_size=1,
    max_size=3,
)


def exited(pid: int) -> bool:
    """Whether ``pid`` has ended: gone, or a zombie. An orphan's zombie stays
    until PID 1 reaps it, which in some containers is late or never."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def timeline_of(stored: Callable[[str, str], list[dict[str, Any]]],
                job_key: str) -> list[dict[str, Any]]:
    """A job's timeline entries on ``HOPS_TIMELINE``, oldest first
    (``stored``: :meth:`tests.livestack.Bus.stored`)."""
    return stored("HOPS_TIMELINE", f"hops.v1.timeline.{job_key}")
