"""How fast a job runs at the CPU cores it holds: the world model the
simulator and the emulated executors share (CODA, docs/coda.md).

A GPU job's speed at the cores it holds is its GPU-only speed (the ground
truth) times the normalised throughput Synergy measured at that many cores
per GPU relative to the curve's peak (:mod:`world.cpu_scaling`; Mohan et
al., OSDI'22, MIT licence): with cores enough the job runs as the GPU-only
truth says, with fewer its GPUs wait for data. The same factor is the share
of its GPUs' held time they are busy. A configuration without cores (a
GPU-only policy) runs at full speed, as before cores were scheduled.

A CPU job's work is ``total_samples`` core-seconds: it progresses at the
cores it holds (this project's model; CODA gives no curve for CPU jobs).
"""

from __future__ import annotations

from shared.configuration import Configuration
from shared.job import JobSpec
from world.cpu_scaling import curve_for
from world.truth import GroundTruth


def core_factor(model: str, config: Configuration) -> float:
    """The fraction of its GPU-only speed a job runs at on ``config``: on
    its slowest server, the curve at the cores it holds per GPU there."""
    if not config.extras or not config.total_gpus:
        return 1.0
    curve = curve_for(model, config.total_gpus)
    peak = curve.peak()
    if peak <= 0:
        return 1.0
    # The curve's axis is cores per GPU (world.cpu_scaling).
    worst = min(config.cores_on(s) / g for s, g in config.parts)
    return min(1.0, curve.speed(worst) / peak)


def cpu_rate(config: Configuration) -> float:
    """A CPU job's progress, core-seconds per second: the cores it holds."""
    return float(config.total_cores)


def speed(truth: GroundTruth, spec: JobSpec, model: str, config: Configuration) -> float:
    """Samples per second of ``spec`` (truly ``model``) on ``config``."""
    if spec.kind == "cpu":
        return cpu_rate(config)
    return truth.throughput(model, config.gpus_only) * core_factor(model, config)
