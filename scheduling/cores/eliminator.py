"""CODA's real-time contention eliminator (CODA §V-D): protect GPU training
jobs from CPU jobs that saturate a server's memory bandwidth.

GPU training jobs are sensitive to memory-bandwidth contention (§IV-C), and
outrank CPU jobs (§V-A), so only CPU jobs are ever throttled. Each period,
per server: when the bandwidth in use reaches ``threshold`` (75%, the paper's
default) of the server's capacity *and* some GPU job's utilisation has
dropped, every CPU job on the server is throttled: by Intel MBA where the
server has it, else by halving its cores (at least one core stays). Either
repeats each period while the contention lasts.

The paper names no MBA level. This project's choice mirrors the fallback:
each throttle halves the job's cap, rounded down to MBA's usual 10% steps,
from 100% (no cap) to 50, 20 and at least :data:`MBA_FLOOR` (10%). A cap
slows only what a job draws beyond it, so a light CPU job is hardly touched
where halving its cores would halve it.

Lifting the throttle is this project's choice (the paper does not say): once
the bandwidth in use falls below ``release`` (60%) of capacity, every
throttled CPU job gets its MBA cap lifted and its requested cores back.
Between ``release`` and ``threshold`` nothing changes (hysteresis, so a job
is not throttled and released on alternate periods). Pure and deterministic:
the caller measures (MBM, NVML) and applies the actions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import msgspec

from shared.ids import JobId, ServerId

ActionKind = Literal["mba_throttle", "halve_cores", "lift"]
MBA_STEP = 10  # percent: Intel MBA's usual granularity
MBA_FLOOR = 10  # percent: the lowest cap the eliminator sets


def lower_cap(percent: int) -> int:
    """The next MBA cap below ``percent``: half, down to a 10% step, at least
    :data:`MBA_FLOOR` (100 -> 50 -> 20 -> 10)."""
    return max(MBA_FLOOR, percent // 2 // MBA_STEP * MBA_STEP)


class EliminatorSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``threshold``: share of the memory bandwidth at which contention is
    suspected, 0.75 (paper, §V-D). ``drop``: the relative fall of a GPU job's
    utilisation (or throughput) below its reference that counts as "drops",
    0.05 (project's choice). ``release``: share below which throttling is
    lifted, 0.6 (project's choice)."""

    threshold: float = 0.75
    drop: float = 0.05
    release: float = 0.6

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in (0, 1], got {self.threshold}")
        if not 0.0 <= self.drop < 1.0:
            raise ValueError(f"drop must lie in [0, 1), got {self.drop}")
        if not 0.0 <= self.release < self.threshold:
            raise ValueError("release must lie in [0, threshold)")


DEFAULT_SETTINGS = EliminatorSettings()


class GpuJobLoad(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A GPU job on the server: its utilisation (or throughput) ``now`` and
    its ``reference`` (before the contention, or the best known)."""

    job: JobId
    now: float
    reference: float

    def __post_init__(self) -> None:
        for v in (self.now, self.reference):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{self.job}: utilisations must be finite and >= 0")

    def dropped(self, drop: float) -> bool:
        """Whether ``now`` lies more than ``drop`` (relative) below the reference."""
        return self.now < self.reference * (1.0 - drop)


class CpuJobLoad(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A CPU job on the server: the ``cores`` it holds now, the ``requested``
    cores it asked for (0: the same as ``cores``), and its MBA cap now
    (``mba_percent``, 100: none)."""

    job: JobId
    cores: int
    requested: int = 0
    mba_percent: int = 100

    def __post_init__(self) -> None:
        if self.cores < 1 or self.requested < 0:
            raise ValueError(f"{self.job}: cores must be >= 1 and requested >= 0")
        if not 1 <= self.mba_percent <= 100:
            raise ValueError(f"{self.job}: mba_percent must lie in 1..100")

    @property
    def asked(self) -> int:
        return self.requested or self.cores

    @property
    def throttled(self) -> bool:
        return self.mba_percent < 100 or self.cores < self.asked


class ServerLoad(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One server's measurements for one period: memory bandwidth capacity
    and use (GB/s; capacity 0: not declared, nothing is judged), MBA support,
    and its jobs."""

    server: ServerId
    capacity_gbps: float
    used_gbps: float
    mba: bool
    gpu_jobs: tuple[GpuJobLoad, ...] = ()
    cpu_jobs: tuple[CpuJobLoad, ...] = ()

    def __post_init__(self) -> None:
        for v in (self.capacity_gbps, self.used_gbps):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"server {self.server}: bandwidths must be finite and >= 0")


class Action(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What to do to one CPU job: throttle it by MBA, halve its cores, or
    lift its throttle. ``cores`` and ``mba_percent``: what it holds and its
    cap afterwards."""

    server: ServerId
    job: JobId
    kind: ActionKind
    cores: int
    mba_percent: int = 100


def contended(load: ServerLoad, settings: EliminatorSettings) -> bool:
    """Bandwidth at or above the threshold and some GPU job dropped (§V-D)."""
    if load.capacity_gbps <= 0:
        return False
    high = load.used_gbps >= settings.threshold * load.capacity_gbps
    return high and any(g.dropped(settings.drop) for g in load.gpu_jobs)


def _throttle(load: ServerLoad, job: CpuJobLoad) -> Action | None:
    if load.mba:
        if job.mba_percent <= MBA_FLOOR:
            return None
        return Action(load.server, job.job, "mba_throttle", job.cores,
                      lower_cap(job.mba_percent))
    if job.cores <= 1:
        return None
    return Action(load.server, job.job, "halve_cores", max(1, job.cores // 2))


def eliminate(load: ServerLoad,
              settings: EliminatorSettings = DEFAULT_SETTINGS) -> tuple[Action, ...]:
    """The actions for one server this period, in the order of its CPU jobs.
    GPU jobs never appear in them."""
    if load.capacity_gbps <= 0:
        return ()
    if contended(load, settings):
        actions = (_throttle(load, j) for j in load.cpu_jobs)
        return tuple(a for a in actions if a is not None)
    if load.used_gbps < settings.release * load.capacity_gbps:
        return tuple(Action(load.server, j.job, "lift", j.asked)
                     for j in load.cpu_jobs if j.throttled)
    return ()


def eliminate_all(loads: Iterable[ServerLoad],
                  settings: EliminatorSettings = DEFAULT_SETTINGS) -> tuple[Action, ...]:
    """:func:`eliminate` over many servers, ordered by server id."""
    ordered = sorted(loads, key=lambda s: s.server)
    return tuple(a for load in ordered for a in eliminate(load, settings))
