"""The simulator's measuring side (Hops §3.2): profiling runs, the running
jobs' samples, the estimates the planner sees, and each job's random stream.
A mixin of :class:`~simulator.engine.Simulation`, which holds the state."""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from estimation.database import ThroughputDatabase
from estimation.estimator import estimate_job
from scheduling import lifecycle as lc
from scheduling.profiling import busy_types, profiling_step
from shared.configuration import Configuration
from shared.estimate import JobEstimate, config_throughput
from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ThroughputSample
from shared.reuse import first_samples_disagree
from simulator.events import ProfileEnd
from simulator.state import JobRecord, Occupancy, profiling_holder
from world.truth import GroundTruth

if TYPE_CHECKING:
    from scheduling.policy import Policy
    from shared.cluster import Cluster
    from simulator.settings import SimSettings


class Measuring:
    """Profiling and sampling, on the engine's state."""

    cluster: Cluster
    policy: Policy
    truth: GroundTruth
    settings: SimSettings
    jobs: dict[JobId, JobRecord]
    occ: Occupancy
    profiling: list[ProfileEnd]
    db: ThroughputDatabase
    estimates: dict[JobId, JobEstimate]
    dirty: set[JobId]
    rngs: dict[JobId, np.random.Generator]
    now: float

    def _move(self, rec: JobRecord, event: lc.Transition) -> None:
        raise NotImplementedError

    def _running(self) -> list[JobRecord]:
        raise NotImplementedError

    def _end_profiling(self, run: ProfileEnd) -> None:
        self.occ.give(profiling_holder(run.job_id, run.server), self.occ.profiling)
        self.db.record_profile(run.report)
        self.dirty.add(run.job_id)
        rec = self.jobs[run.job_id]
        if not rec.unprofiled and not any(p.job_id == rec.id for p in self.profiling):
            self._move(rec, lc.Queue(job_id=rec.id, at=self.now))
            rec.profile_end = self.now

    def _queue_without_busy_types(self, active: Sequence[JobRecord]) -> None:
        """Jobs waiting for a profile only on types every GPU of which runs a
        job join the queue with the profiles they have; a waiting job goes
        back to profiling once such a type is no longer busy (profiling.py)."""
        busy = busy_types(self.cluster, self.occ.jobs)
        in_flight = {p.job_id for p in self.profiling}
        for rec in active:
            if rec.phase not in ("queued", "profiling") or rec.spec.kind == "cpu":
                continue
            waiting = rec.phase == "queued"
            supported = {
                t.name for t in self.cluster.gpu_types if self.truth.supports(rec.model, t.name)
            }
            profiled = supported - rec.unprofiled - rec.deferred
            lacking = rec.deferred if waiting else rec.unprofiled
            step = profiling_step(waiting, profiled, lacking, busy, rec.id in in_flight)
            if step.back:
                rec.unprofiled, rec.deferred = set(step.back), rec.deferred - step.back
                self._move(rec, lc.Profile(job_id=rec.id, at=self.now))
            elif not waiting and step.skip:
                rec.deferred |= step.skip
                rec.unprofiled = set()
                self._move(rec, lc.Queue(job_id=rec.id, at=self.now))
                rec.profile_end = rec.profile_end or self.now

    def _estimates(self, active: Sequence[JobRecord]) -> dict[JobId, JobEstimate]:
        out: dict[JobId, JobEstimate] = {}
        for rec in active:
            if rec.phase == "profiling" or rec.spec.kind == "cpu":
                continue
            if rec.id in self.dirty or rec.id not in self.estimates:
                self.estimates[rec.id] = estimate_job(
                    self.db, rec.spec, self.cluster, self.settings.estimator
                )
                self.dirty.discard(rec.id)
            out[rec.id] = self.estimates[rec.id]
        return out

    def _profile(self, job_id: JobId, gpu_type: GpuType, server: ServerId) -> None:
        rec = self.jobs[job_id]
        if gpu_type not in rec.unprofiled:
            raise RuntimeError(f"{self.policy.name}: {job_id} needs no profiling on {gpu_type}")
        rec.unprofiled.discard(gpu_type)
        self.occ.take(profiling_holder(job_id, server), Configuration(((server, 1),)),
                      self.occ.profiling)
        report, seconds = self.truth.profile(
            job_id, rec.model, server, self.settings.profile_iters, self._rng(job_id)
        )
        if rec.signature:  # what a real executor stamps from the job's spec
            report = msgspec.structs.replace(report, signature=rec.signature)
        run = ProfileEnd(at=self.now + seconds, job_id=job_id, server=server, report=report)
        heapq.heappush(self.profiling, run)

    def _rng(self, job_id: JobId) -> np.random.Generator:
        """The job's own random stream (seed, job id): a job's measurements
        do not depend on what other jobs drew, so two policies run on one
        workload see the same noise for the same job (common random numbers)."""
        rng = self.rngs.get(job_id)
        if rng is None:
            rng = self.rngs[job_id] = np.random.default_rng(
                [self.settings.seed, zlib.crc32(job_id.encode())])
        return rng

    def _sample_running(self) -> None:
        """Running-mode reports of the round that ends (§3.2)."""
        for rec in self._running():
            assert rec.current is not None
            if rec.paused_until >= self.now or rec.spec.kind == "cpu":
                continue
            samples = self.truth.running_samples(
                rec.id, rec.model, rec.current, self.settings.sample_iters, self._rng(rec.id)
            )
            self._check_reused(rec, samples)
            for sample in samples:
                self.db.record_sample(sample)
            self.dirty.add(rec.id)

    def _check_reused(self, rec: JobRecord, samples: Sequence[ThroughputSample]) -> None:
        """A job's first samples on a type it was estimated on from its
        signature's shared profile: one that disagrees with the estimate
        (shared.reuse.disagrees) marks the profile stale, so the signature's
        next job is profiled there again."""
        if not samples or rec.signature is None or rec.current is None:
            return
        gpu_type = samples[0].gpu_type
        estimate = self.estimates.get(rec.id)
        if not self.db.checks_reuse(rec.id, gpu_type):
            return  # profiled itself, or corrected by its own samples already
        if estimate is None or gpu_type not in estimate.by_type:
            return
        predicted = config_throughput(estimate, self.cluster, rec.current)
        if first_samples_disagree(predicted, samples, rec.current.total_gpus) is not None:
            self.db.mark_stale(rec.signature, frozenset((gpu_type,)))
