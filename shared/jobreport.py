"""What a real training process tells its node executor (Hops §3.2).

The executor starts a job's command with the environment of
:mod:`shared.jobenv`; the job's plugin (:mod:`hops.plugin`) appends one JSON
object per line to the file named by ``HOPS_REPORT_FILE``. The executor
tails that file and turns the lines into the live system's events
(heartbeat progress, ``profile_reported``, ``sample_reported``,
``job_finished``). A file, not a pipe, so that an executor that restarts
can adopt a running job and read what it wrote meanwhile.

Only local rank 0 of each node writes; every node reports its own samples
(the estimator's entity layer wants each server's view), and the node of
global rank 0 reports the end of the job. Lines are tagged in ``"kind"``;
a reader skips a line it cannot decode (a torn last line, a newer kind).
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from shared.measurements import TimeModules


class ReportLine(msgspec.Struct, frozen=True, tag_field="kind", kw_only=True):
    """Base of every line: ``at`` is the writer's wall clock (seconds)."""

    at: float = 0.0


class Started(ReportLine, frozen=True, tag="started"):
    """The loop is about to run its first iteration, resumed at ``samples_done``
    (from the checkpoint at ``checkpoint``, empty for a fresh start)."""

    samples_done: float = 0.0
    checkpoint: str = ""
    world_size: int = 1


class Progress(ReportLine, frozen=True, tag="progress"):
    """Samples done over the whole job (all ranks) after ``iterations`` of this run."""

    samples_done: float
    iterations: int = 0


class Profiled(ReportLine, frozen=True, tag="profiled"):
    """Profiling mode: the time modules of ``iterations`` measured iterations
    (after warm-up) at per-process batch ``batch_size``; ``throughput`` is the
    measured samples/s of this process, for reference."""

    modules: TimeModules
    batch_size: int
    iterations: int
    throughput: float = 0.0


class Sampled(ReportLine, frozen=True, tag="sampled"):
    """Running mode, every sample period: the measured per-process (per-GPU)
    throughput over the period and per-iteration data and wait times.
    ``comm_times`` pairs with them where the gradient all-reduce's time was
    measured (DistributedDataParallel on gloo), else it is empty.
    ``cores`` is the number of CPU cores the process could run on at the
    end of the period (its affinity; 0: not known), so the CPU allocator
    learns from measured samples at each core count."""

    samples_done: float
    per_gpu_throughput: float
    data_times: tuple[float, ...] = ()
    wait_times: tuple[float, ...] = ()
    comm_times: tuple[float, ...] = ()
    cores: int = 0


class Checkpointed(ReportLine, frozen=True, tag="checkpointed"):
    """A checkpoint at ``samples_done`` was written to ``path`` (on SIGTERM
    the job writes one, reports it and exits 0)."""

    samples_done: float
    path: str = ""


class Finished(ReportLine, frozen=True, tag="finished"):
    """The job did all its samples; the process exits 0 next."""

    samples_done: float


AnyReport: TypeAlias = Started | Progress | Profiled | Sampled | Checkpointed | Finished

_ENCODER = msgspec.json.Encoder()
_DECODER: msgspec.json.Decoder[AnyReport] = msgspec.json.Decoder(AnyReport)


def encode_line(line: AnyReport) -> bytes:
    """One line of the report file, newline included."""
    return _ENCODER.encode(line) + b"\n"


def decode_line(raw: bytes) -> AnyReport | None:
    """The report on one line, or None if the line is not one (torn, unknown)."""
    try:
        return _DECODER.decode(raw.strip())
    except msgspec.DecodeError:
        return None
