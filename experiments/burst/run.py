"""Run the burst scenario (:mod:`experiments.burst.workload`) in the
simulator and measure what issue 33 item 2 bounds, per round of the burst
(from its arrival until its last job finished or the horizon):

- GPUs booked (running jobs and profiling runs), sampled after every plan
  and every release, averaged over time while a waiting job fits the idle
  GPUs (on a GPU type its model runs on, whatever the scheduler has
  profiled);
- restarts of each long job during the burst, and long jobs failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from experiments.burst.workload import BURST_PREFIX, LONG_PREFIX, BurstScenario, burst_jobs
from scheduling.registry import make_policy, resolve
from shared.cluster import Cluster
from shared.ids import GpuType, JobId, ServerId
from simulator.engine import Simulation
from simulator.settings import SimSettings
from simulator.state import JobRecord
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.truth import GroundTruth

# The live bench's rounds: 10 s of wall time at time scale 60.
BURST_ROUND_S = 600.0


class BurstRound(msgspec.Struct, frozen=True):
    """A sample after a plan or a release: GPUs booked, and whether a
    waiting job fits the idle ones (it holds until the next sample)."""

    t: float
    booked: int
    fits_waiting: bool


class BurstFigures(msgspec.Struct, frozen=True):
    """What the bench prints, from the simulator."""

    gpus: int
    rounds: int  # rounds of the burst
    fit_waiting_s: float  # seconds of the burst in which a waiting job fits
    booked_share: float  # time-weighted mean booked share over them (1.0: none)
    restarts: dict[str, int]  # per long job, during the burst
    long_failed: int
    burst_done: int
    end_s: float

    @property
    def max_restarts(self) -> int:
        return max(self.restarts.values(), default=0)


def fits(rec: JobRecord, idle: Mapping[ServerId, int], types: Mapping[ServerId, GpuType],
         truth: GroundTruth) -> bool:
    """Whether some requirement of ``rec`` fits the idle GPUs of one type it runs on."""
    per_type: dict[GpuType, int] = {}
    for sid, g in idle.items():
        if truth.supports(rec.model, types[sid]):
            per_type[types[sid]] = per_type.get(types[sid], 0) + g
    return any(r <= g for r in rec.spec.requirement_set() for g in per_type.values())


class BurstSimulation(Simulation):
    """The engine, also recording a :class:`BurstRound` after each plan and
    release from the burst on, and each long job's restarts when it arrives."""

    def __init__(self, *args: Any, burst_at: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.burst_at = burst_at
        self.burst_rounds: list[BurstRound] = []
        self.restarts_before: dict[JobId, int] | None = None
        self.restarts_after: dict[JobId, int] | None = None
        self.burst_left = sum(1 for j in self.jobs if j.startswith(BURST_PREFIX))
        self.rounds_seen = 0
        self._types = {s.id: s.gpu_type for s in self.cluster.servers}

    def _round(self) -> None:
        if self.now >= self.burst_at and self.restarts_before is None:
            self.restarts_before = self._restarts()
            self.rounds_seen = 0
        super()._round()
        self.rounds_seen += 1

    def _plan(self, first: bool) -> float:
        spent = super()._plan(first)
        self._sample()
        return spent

    def _complete(self, rec: JobRecord) -> None:
        super()._complete(rec)
        self._sample()
        if rec.id.startswith(BURST_PREFIX):
            self.burst_left -= 1
            if self.burst_left == 0:  # the end of the burst: the long jobs run on
                self.restarts_after = self._restarts()
                self.done = len(self.jobs)  # the engine's loop stops here

    def _restarts(self) -> dict[JobId, int]:
        return {j: r.restarts for j, r in self.jobs.items() if j.startswith(LONG_PREFIX)}

    def _sample(self) -> None:
        if self.restarts_before is None:
            return
        idle = {s.id: s.gpus - self.occ.used(s.id) for s in self.cluster.servers}
        waiting = any(r.phase == "queued" and fits(r, idle, self._types, self.truth)
                      for r in self.live.values())
        booked = self.cluster.total_gpus - sum(idle.values())
        self.burst_rounds.append(BurstRound(self.now, booked, waiting))


def figures(sim: BurstSimulation) -> BurstFigures:
    before = sim.restarts_before or {}
    after = sim.restarts_after or sim._restarts()
    samples = sim.burst_rounds
    total = sim.cluster.total_gpus
    span = booked = 0.0
    for r, nxt in zip(samples, [*samples[1:], None], strict=True):
        dt = (nxt.t if nxt is not None else sim.now) - r.t
        if r.fits_waiting:
            span += dt
            booked += dt * r.booked
    share = booked / (total * span) if span > 0 else 1.0
    longs = {j: r for j, r in sim.jobs.items() if j.startswith(LONG_PREFIX)}
    return BurstFigures(
        gpus=total, rounds=sim.rounds_seen, fit_waiting_s=span, booked_share=share,
        restarts={j: n - before.get(j, 0) for j, n in after.items()},
        long_failed=sum(1 for r in longs.values() if r.phase == "failed"),
        burst_done=sum(1 for j, r in sim.jobs.items()
                       if j.startswith(BURST_PREFIX) and r.phase == "finished"),
        end_s=sim.now,
    )


def run_burst(scenario: BurstScenario, policy: str = "hops", cluster: str = "paper-physical",
              round_s: float = BURST_ROUND_S, horizon_s: float | None = None) -> BurstFigures:
    """Simulate ``scenario`` under ``policy`` until the last job of the
    burst finished (the long jobs outlive it) or ``horizon_s``."""
    c: Cluster = cluster_arg(cluster)
    truth = GroundTruth(c, builtin_catalog())
    jobs = burst_jobs(scenario)
    spec = resolve(policy)
    settings = SimSettings(round_s=round_s, seed=scenario.seed, r_num=spec.r_num,
                           max_time_s=horizon_s or 90 * 86400.0)
    sim = BurstSimulation(c, jobs, make_policy(spec), truth, settings,
                          burst_at=scenario.burst_at)
    sim.run()
    return figures(sim)


def line(policy: str, f: BurstFigures) -> str:
    """One row of :func:`main`'s table."""
    restarts = sorted(f.restarts.values())
    return (f"| `{policy}` | {f.booked_share:.1%} | {f.fit_waiting_s / 3600:.2f} | "
            f"{f.max_restarts} | {sum(restarts) / max(1, len(restarts)):.1f} | "
            f"{f.long_failed} | {f.end_s / 3600:.2f} |")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m experiments.burst.run [--burst N] [--long N] [--round-s S] SPEC...``:
    one table row per policy spec."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m experiments.burst.run")
    p.add_argument("policies", nargs="*", default=["hops"])
    p.add_argument("--burst", type=int, default=BurstScenario().burst)
    p.add_argument("--long", type=int, default=BurstScenario().long_jobs)
    p.add_argument("--round-s", type=float, default=BURST_ROUND_S)
    args = p.parse_args(argv)
    scenario = BurstScenario(burst=args.burst, long_jobs=args.long)
    print("| policy | booked while a job that fits waits | such hours | most restarts "
          "of a long job | mean | long jobs failed | burst done at (h) |")
    print("|---|---|---|---|---|---|---|")
    for policy in args.policies:
        print(line(policy, run_burst(scenario, policy, round_s=args.round_s)), flush=True)


if __name__ == "__main__":
    main()
