"""What a planning policy sees (a :class:`Snapshot`) and what it decides (a :class:`Plan`).

Both are frozen msgspec Structs so that the live scheduler can log and ship
them, and the simulator can replay them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.explain import Why
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.resources import NOTHING, Resources

Phase = Literal["profiling", "queued", "running"]


class JobState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A job the scheduler is responsible for, as of ``Snapshot.now``.

    ``phase`` is ``profiling`` while some GPU type still has to be profiled
    (those types are listed in ``unprofiled``); ``queued`` while it waits;
    ``running`` while it holds ``current``.
    """

    spec: JobSpec
    phase: Phase = "queued"
    wait_s: float = 0.0
    attained_gpu_s: float = 0.0
    done_samples: float = 0.0
    current: Configuration | None = None
    unprofiled: tuple[GpuType, ...] = ()
    # Seconds this job has run on each GPU type (round-robin realisations such
    # as Gavel's need it; LAS reads attained_gpu_s).
    attained_by_type: dict[GpuType, float] = {}
    # Times this job's configuration changed (checkpoint-restarts so far).
    restarts: int = 0
    # Samples per second it made since ``throughput_since``, when its
    # configuration (cores included) last changed, as the mechanism measured
    # them (0: not measured yet): what CODA's allocator climbs on (§V-B-2).
    throughput: float = 0.0
    throughput_since: float = 0.0
    # Seconds one checkpoint-restart of this job costs, as the mechanism
    # knows it (0: not known, the policies take scheduling.rounds.RESTART_S).
    restart_s: float = 0.0

    @property
    def id(self) -> JobId:
        return self.spec.id

    @property
    def remaining_samples(self) -> float:
        return max(0.0, self.spec.total_samples - self.done_samples)


class Snapshot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Input of one planning call.

    ``first_plan`` is true at the start of a round: every running job is
    replanned and ``held`` lists only GPUs that no plan may use (down,
    reserved or profiling). For a plan later in the round (§3.6, resources released by a job
    that ended) it is false, running jobs keep their GPUs and ``held`` includes
    them.

    ``held_extras`` is the same for the resources other than GPUs (CPU cores,
    memory) that configurations hold (``Configuration.extras``): those of the
    running jobs in a later plan, and any a layer keeps from the policy
    beneath it. Empty while every configuration holds GPUs only.
    """

    now: float
    cluster: Cluster
    jobs: tuple[JobState, ...]
    estimates: dict[JobId, JobEstimate] = {}
    held: dict[ServerId, int] = {}
    first_plan: bool = True
    # GPUs of ``held`` that profiling runs in progress hold (§3.2): the
    # profiling queue's share of each type counts them.
    profiling_held: dict[ServerId, int] = {}
    # Cores and memory held outside the plan, per server (no GPUs: those are
    # in ``held``).
    held_extras: dict[ServerId, Resources] = {}
    # The opaque state each stateful layer left after the previous plan, by
    # layer name (``LayerRecord.state``): the simulator threads it from plan
    # to plan, the live leader keeps it in KV so a standby plans the same.
    layer_state: dict[str, bytes] = {}
    # Memory bandwidth in use per server, GB/s, as measured (resctrl's MBM
    # live, the world model in the simulator); empty where not measured.
    # CODA's contention eliminator (§V-D) reads it.
    bandwidth_gbps: dict[ServerId, float] = {}

    def __post_init__(self) -> None:
        for sid, extra in self.held_extras.items():
            if extra.gpus:
                raise ValueError(f"snapshot: held_extras of {sid} name GPUs; they belong in held")

    def free_gpus(self) -> dict[ServerId, int]:
        return {
            s.id: max(0, s.gpus - self.held.get(s.id, 0)) for s in self.cluster.servers
        }

    def free_resources(self) -> dict[ServerId, Resources]:
        """What a plan may still book on each server, in every resource:
        its capacity less the GPUs of ``held`` and the ``held_extras``."""
        held, extras = self.held, self.held_extras
        out: dict[ServerId, Resources] = {}
        for s in self.cluster.servers:
            extra = extras.get(s.id, NOTHING)
            out[s.id] = s.capacity.minus(
                Resources(held.get(s.id, 0), extra.cores, extra.memory_mb)
            )
        return out


class Assignment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One job's configuration for the rest of the round."""

    job_id: JobId
    config: Configuration
    throughput: float = 0.0
    gain: float = 0.0


class ProfilingTask(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Run ``job_id`` for a few iterations on one GPU of ``server`` (§3.2)."""

    job_id: JobId
    gpu_type: GpuType
    server: ServerId
    gpus: int = 1


class PassStats(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ILP pass of a round: why it chose what it chose."""

    kind: Literal["first", "fill"]
    jobs: int
    variables: int
    objective: float
    bound: float
    gap: float
    solve_s: float
    status: str
    formulation: str
    assigned: tuple[JobId, ...] = ()


class LayerRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one layer around the policy did in this call
    (scheduling/layers): the GPUs it kept from the policy beneath
    it, the jobs it held back, the assignments it removed, and a note.
    ``state`` is a stateful layer's opaque state after this plan (HiveD's
    cell bindings), which the next snapshot carries back as
    ``Snapshot.layer_state[name]``; empty for a stateless layer."""

    name: str
    held: dict[ServerId, int] = {}
    held_back: tuple[JobId, ...] = ()
    removed: tuple[JobId, ...] = ()
    note: str = ""
    state: bytes = b""
    # This layer's own reason for each job it held back or removed
    # (``TenantCells``, ``Quota``, ``Cores``; shared.explain).
    why: dict[JobId, Why] = {}


class PlanReasons(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Why the plan looks the way it does, for logs and a later dashboard."""

    policy: str
    priorities: dict[JobId, float] = {}
    # Eq. (8) of every ranked job, whatever the queue priority: the queue
    # view and the monitor report it, and must not recompute it.
    latency_ratios: dict[JobId, float] = {}
    window: tuple[JobId, ...] = ()
    admitted_by_adjustment: tuple[JobId, ...] = ()
    passes: tuple[PassStats, ...] = ()
    # Waiting jobs no configuration on this call's GPUs could serve: left out
    # of the call so that they hold nothing back.
    unplaceable: tuple[JobId, ...] = ()
    # One record per layer the policy is wrapped in, outermost first; the
    # default keeps plans written before layers readable.
    layers: tuple[LayerRecord, ...] = ()
    # The primary reason of every job of the snapshot this plan does not run
    # (scheduling.explain): a pure function of the snapshot and the plan,
    # filled in by the mechanism after the policy planned.
    why: dict[JobId, Why] = {}


class Plan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Output of one planning call. For a first plan, jobs missing from
    ``assignments`` hold nothing this round; for a later plan, the assignments
    are additions to what already runs, or in-place changes of a running
    job's cores (same GPUs, other extras)."""

    assignments: tuple[Assignment, ...] = ()
    profiling: tuple[ProfilingTask, ...] = ()
    reasons: PlanReasons = PlanReasons(policy="none")
    # A layer that needs to act again before the next round (CODA's allocator
    # samples every period) asks for a plan within this many seconds; 0: no
    # need. In a later plan an assignment of a running job that keeps its
    # GPUs and changes only its cores or memory is a change in place.
    wake_after_s: float = 0.0

    def config_of(self, job_id: JobId) -> Configuration | None:
        for a in self.assignments:
            if a.job_id == job_id:
                return a.config
        return None
