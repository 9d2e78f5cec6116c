"""Mutable bookkeeping of one simulation run: jobs and the GPUs, cores and
memory they hold over virtual time.

Nothing here knows which policy runs; the engine (``simulator.engine``) moves
jobs between phases through the one job lifecycle
(:mod:`scheduling.lifecycle`, which the live scheduler uses too) and
this module keeps the numbers consistent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.lifecycle import Life, Outcome, Transition, step
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import JobPhase
from shared.resources import NOTHING, Ledger, Resources
from shared.reuse import Signature
from shared.snapshot import JobState, Phase


@dataclass
class JobRecord:
    """One job's life in the simulation."""

    spec: JobSpec
    model: str
    # Phase, configuration, restarts, first start and finish: None before arrival.
    life: Life | None = None
    unprofiled: set[GpuType] = field(default_factory=set)
    # Types it joined the queue without, every GPU of them running a job
    # (scheduling.profiling): profiled once one is idle again.
    deferred: set[GpuType] = field(default_factory=set)
    signature: Signature | None = None  # its profile signature (shared.reuse)
    rate: float = 0.0  # true samples/s of ``current``
    paused_until: float = 0.0  # checkpoint-restart: no progress before this time
    done_samples: float = 0.0
    wait_s: float = 0.0
    attained_gpu_s: float = 0.0
    attained_by_type: dict[GpuType, float] = field(default_factory=dict)
    profile_end: float | None = None
    # Cores (CODA): the share of its GPUs' time the job keeps them busy at
    # the cores it holds (1: GPUs only, or cores enough), the GPU time
    # spent busy, when its configuration last changed, and in-place changes.
    factor: float = 1.0
    base_factor: float = 1.0  # ``factor`` without bandwidth contention
    base_rate: float = 0.0  # ``rate`` without bandwidth contention
    busy_gpu_s: float = 0.0
    rate_since: float = 0.0
    retunes: int = 0
    restart_s: float = 0.0  # what one checkpoint-restart costs it (world.restarts)

    @property
    def id(self) -> JobId:
        return self.spec.id

    @property
    def phase(self) -> JobPhase | None:
        return None if self.life is None else self.life.phase

    @property
    def current(self) -> Configuration | None:
        return None if self.life is None else self.life.configuration

    @property
    def restarts(self) -> int:
        return 0 if self.life is None else self.life.restarts

    @property
    def first_start(self) -> float | None:
        return None if self.life is None else self.life.first_start

    @property
    def finish(self) -> float | None:
        return None if self.life is None else self.life.finished_at

    def move(self, event: Transition) -> Outcome:
        """Apply ``event`` to the job's life; a refusal changes nothing."""
        outcome = step(self.life, event)
        if isinstance(outcome, Life):
            self.life = outcome
        return outcome

    @property
    def remaining(self) -> float:
        return max(0.0, self.spec.total_samples - self.done_samples)

    def advance(self, start: float, end: float, cluster: Cluster) -> None:
        """Account for [start, end): progress if running, waiting if queued."""
        if end <= start or self.finish is not None:
            return
        if self.phase == "queued":
            self.wait_s += end - start
        elif self.phase == "running" and self.current is not None:
            useful = max(0.0, end - max(start, self.paused_until))
            self.done_samples = min(
                float(self.spec.total_samples), self.done_samples + self.rate * useful
            )
            held = end - start
            gpus = self.current.total_gpus
            if not gpus:
                return  # a CPU job: no GPU time
            self.attained_gpu_s += held * gpus
            self.busy_gpu_s += useful * gpus * self.factor
            gpu_type = cluster.by_id[self.current.parts[0][0]].gpu_type
            self.attained_by_type[gpu_type] = self.attained_by_type.get(gpu_type, 0.0) + held

    def completion_time(self, now: float) -> float:
        """When the job finishes at its current rate (inf if it does not run)."""
        if self.phase != "running" or self.rate <= 0:
            return float("inf")
        return max(now, self.paused_until) + self.remaining / self.rate

    def state(self) -> JobState:
        return JobState(
            spec=self.spec,
            phase=_planned(self.phase),
            wait_s=self.wait_s,
            attained_gpu_s=self.attained_gpu_s,
            done_samples=self.done_samples,
            current=self.current,
            unprofiled=tuple(sorted(self.unprofiled)),
            attained_by_type=dict(self.attained_by_type),
            restarts=self.restarts,
            throughput=self.rate if self.phase == "running" else 0.0,
            throughput_since=max(self.rate_since, self.paused_until),
            restart_s=self.restart_s,
        )


def _planned(phase: JobPhase | None) -> Phase:
    """The phase of a job the planner sees: arrived and not finished."""
    match phase:
        case "profiling" | "queued" | "running":
            return phase
        case _:
            raise ValueError(f"a job {phase or 'not yet arrived'} is not planned")


@dataclass
class Occupancy:
    """GPUs in use per server, by running jobs and by profiling runs, for the
    engine's snapshots; every resource a holder takes is booked on one
    :class:`~shared.resources.Ledger` against the servers' capacities, so an
    over-allocation in any resource (GPUs, CPU cores, memory) raises
    :class:`~shared.resources.OverAllocation` naming the server and resource."""

    cluster: Cluster
    jobs: dict[ServerId, int] = field(default_factory=dict)
    profiling: dict[ServerId, int] = field(default_factory=dict)
    # Cores and memory the holders' configurations hold per server (only
    # configurations with extras add to it; empty with GPU-only ones).
    extras: dict[ServerId, Resources] = field(default_factory=dict)
    ledger: Ledger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.cluster.capacity())

    def take(self, holder: str, config: Configuration, pool: dict[ServerId, int]) -> None:
        """Book ``config`` for ``holder`` and count its GPUs in ``pool``."""
        if self.ledger.held_by(holder):
            raise RuntimeError(f"{holder} already holds resources")
        self.ledger.book(holder, config.demands())
        for sid, g in config.parts:
            pool[sid] = pool.get(sid, 0) + g
        if config.extras:
            for sid, extra in zip(config.servers, config.extras, strict=True):
                self.extras[sid] = self.extras.get(sid, NOTHING) + extra

    def give(self, holder: str, pool: dict[ServerId, int]) -> None:
        """Release all ``holder`` booked and uncount its GPUs from ``pool``."""
        held = self.ledger.release(holder)
        if not held:
            raise RuntimeError(f"{holder} released resources it did not hold")
        for sid, want in held.items():
            pool[sid] -= want.gpus
            if pool[sid] < 0:
                raise RuntimeError(f"server {sid}: released more GPUs than held")
            if want.cores or want.memory_mb:
                left = self.extras[sid].minus(Resources(0, want.cores, want.memory_mb))
                if left.is_zero:
                    del self.extras[sid]
                else:
                    self.extras[sid] = left

    def used(self, sid: ServerId) -> int:
        return self.jobs.get(sid, 0) + self.profiling.get(sid, 0)

    def idle(self) -> int:
        return sum(s.gpus - self.used(s.id) for s in self.cluster.servers)


def job_holder(job_id: JobId) -> str:
    """The ledger's holder of a running job's resources."""
    return f"job {job_id}"


def profiling_holder(job_id: JobId, server: ServerId) -> str:
    """The ledger's holder of a profiling run (one per job and server at a time)."""
    return f"profiling {job_id} on {server}"
