"""The EMULATED job: a pure model of how far a job is after some wall time,
and of when it reports.

The emulator stands in for a real training process on a machine without
GPUs. A job on ``configuration`` advances at the world model's ground-truth
throughput (:meth:`world.truth.GroundTruth.throughput`, the whole job's
samples/s, at the cores it holds: :func:`world.cores.speed`; a CPU job at
its cores) times ``time_scale``, starting from the ``samples_done`` it was
resumed at, so a job the ground truth runs for an hour ends after
``3600 / time_scale`` wall seconds. A profiling run (§3.2, profiling mode)
lasts the ground truth's profiling time divided by ``time_scale``.

Nothing here reads a clock: callers pass elapsed seconds.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Literal

from shared.configuration import Configuration
from shared.ids import ServerId
from shared.job import JobSpec
from world.cores import speed
from world.truth import GroundTruth

Role = Literal["lead", "worker", "profile"]
# Running-mode reports carry at most this many per-iteration observations
# (the simulator's SimSettings.sample_iters), however long the interval.
MAX_SAMPLE_ITERS = 50


class EmulationError(ValueError):
    """The emulator cannot run this job here (unknown model or GPU type)."""


class UnknownModel(EmulationError):
    """The model is in no catalog of the emulator: no server can run it."""


def role_of(mode: str, configuration: Configuration, server: ServerId) -> Role:
    """What the process on ``server`` does.

    Data-parallel ranks advance together, so one process per job is enough to
    emulate progress: the executor of the first server of the configuration
    (configurations are sorted by server id) runs the ``lead``, which
    advances, reports samples and ends the job; the other servers run a
    ``worker`` that only heartbeats, so that losing any server of the job is
    noticed. A profiling run is its own ``profile`` process.
    """
    if mode == "profile":
        return "profile"
    return "lead" if configuration.parts[0][0] == server else "worker"


def check_runnable(truth: GroundTruth, model: str, server: ServerId) -> None:
    """Raise :class:`EmulationError` unless ``model`` runs on ``server``'s GPU type."""
    if model not in truth.catalog:
        raise UnknownModel(f"unknown model {model!r}: not in the emulator's catalog")
    srv = truth.cluster.by_id.get(server)
    if srv is None:
        raise EmulationError(f"server {server!r} is not in the emulated cluster")
    if not truth.supports(model, srv.gpu_type):
        raise EmulationError(f"model {model!r} does not run on {srv.gpu_type}")


@dataclass(frozen=True)
class Progress:
    """A run at ``rate`` samples per wall second from ``start`` to ``total``."""

    rate: float
    start: float
    total: float

    def at(self, elapsed: float) -> float:
        """Samples done after ``elapsed`` wall seconds."""
        return min(self.total, self.start + self.rate * max(0.0, elapsed))

    def remaining_s(self, elapsed: float) -> float:
        """Wall seconds until the last sample (0 once done)."""
        left = self.total - self.at(elapsed)
        if left <= 0:
            return 0.0
        return left / self.rate if self.rate > 0 else math.inf

    def done(self, elapsed: float) -> bool:
        return self.at(elapsed) >= self.total


def run_progress(
    truth: GroundTruth,
    spec: JobSpec,
    configuration: Configuration,
    samples_done: float,
    time_scale: float,
) -> Progress:
    """The emulated progress of ``spec`` on ``configuration`` (see the module)."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if spec.kind != "cpu":  # a CPU job runs anywhere it has cores
        for server in configuration.servers:
            check_runnable(truth, spec.model, server)
    rate = speed(truth, spec, spec.model, configuration) * time_scale
    start = min(max(0.0, samples_done), float(spec.total_samples))
    return Progress(rate=rate, start=start, total=float(spec.total_samples))


def sample_iterations(samples: float, batch_size: int, total_gpus: int) -> int:
    """Iterations behind ``samples`` samples (one iteration is a batch per
    GPU), between 1 and :data:`MAX_SAMPLE_ITERS`."""
    iters = int(max(0.0, samples) // max(1, batch_size * total_gpus))
    return max(1, min(MAX_SAMPLE_ITERS, iters))


def profile_wall_s(truth_seconds: float, time_scale: float) -> float:
    """Wall seconds of a profiling run the ground truth times at ``truth_seconds``."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    return max(0.0, truth_seconds) / time_scale


def job_seed(*parts: str) -> int:
    """A stable seed for a job's random draws (the same command draws the
    same numbers in every process and on every run)."""
    return zlib.crc32("\x00".join(parts).encode())


@dataclass
class Cadence:
    """Something due every ``period`` seconds, first at ``next_at``."""

    period: float
    next_at: float = 0.0

    def due(self, t: float) -> bool:
        """True (and schedule the next one) when ``t`` reached the due time."""
        if t < self.next_at:
            return False
        # From t, not next_at: a late tick does not trigger a burst of catch-ups.
        self.next_at = t + self.period
        return True


def log_line_start(job_id: str, model: str, server: ServerId, role: Role, done: float,
                   total: float) -> str:
    """The first line an emulated process writes to its rank's log."""
    what = "profiling" if role == "profile" else "training"
    return (f"[emulated] {what} {model} for job {job_id} on {server} ({role}); "
            f"{done:.0f}/{total:.0f} samples done")


def log_line_step(done: float, total: float, rate: float, batch_size: int) -> str:
    """A periodic line, as a training script prints one: the step, a loss
    that falls as the job advances, and the rate in samples per second."""
    step = int(done // max(1, batch_size))
    frac = min(1.0, done / total) if total > 0 else 1.0
    loss = 0.1 + 2.2 * math.exp(-4.0 * frac)
    return f"step {step} loss {loss:.4f} samples/s {rate:.1f} ({100 * frac:.1f}%)"


def log_line_end(done: float, how: str) -> str:
    """The last line: ``finished``, ``stopped`` or ``profiled``."""
    return f"[emulated] {how} at {done:.0f} samples"
