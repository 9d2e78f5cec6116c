"""Reading a real job's report file, and what its lines mean.

The job's plugin appends :mod:`shared.jobreport` lines to
``HOPS_REPORT_FILE``; the executor polls the file (:class:`ReportTail`),
keeping the byte offset of the last whole line so that a restarted
executor goes on where it was, and never reads a line being written
(torn) as a whole one. :class:`JobReports` turns the lines into progress
and into the messages the estimator wants; :func:`verdict` says what the
job's end on this node means. Everything but :meth:`ReportTail.read` and
:func:`log_tail` is pure.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from executor.isolation import open_job_file
from shared.events import JobFailed, JobFinished, ProfileReported, SampleReported, StartJob
from shared.ids import GpuType
from shared.jobreport import (
    AnyReport,
    Checkpointed,
    Finished,
    Profiled,
    Progress,
    Sampled,
    Started,
    decode_line,
)
from shared.measurements import ProfileReport, ThroughputSample
from shared.reuse import profile_signature

MAX_READ = 1 << 20  # bytes per poll: a burst of lines is read over several polls
TAIL_LINES = 20
TAIL_BYTES = 4096


def split_lines(data: bytes, final: bool = False) -> tuple[list[AnyReport], int, int]:
    """The reports on the whole lines of ``data``, the bytes they take and
    how many lines could not be decoded. The last line counts only when it
    ends with a newline (it may still be being written), or when ``final``
    (the writer is gone)."""
    end = len(data) if final else data.rfind(b"\n") + 1
    reports: list[AnyReport] = []
    bad = 0
    for raw in data[:end].splitlines():
        if not raw.strip():
            continue
        line = decode_line(raw)
        if line is None:
            bad += 1
        else:
            reports.append(line)
    return reports, end, bad


@dataclass
class ReportTail:
    """The part of a report file not read yet: from ``offset`` on."""

    path: Path
    offset: int = 0
    skipped: int = 0  # lines that could not be decoded

    def read(self, final: bool = False) -> list[AnyReport]:
        """The reports appended since the last read (none if no file yet)."""
        try:
            with open_job_file(self.path) as f:
                size = f.seek(0, 2)
                if size < self.offset:  # the file was replaced: read it anew
                    self.offset = 0
                f.seek(self.offset)
                data = f.read(MAX_READ)
        except OSError:  # none yet, or not a plain file (the job's doing)
            return []
        reports, used, bad = split_lines(data, final and len(data) < MAX_READ)
        self.offset += used
        self.skipped += bad
        return reports


def log_tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``path``, at most ``max_bytes`` bytes."""
    try:
        with open_job_file(path) as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if len(data) == max_bytes and size > max_bytes:
        text = text.split("\n", 1)[-1]  # drop the first, partial line
    return "\n".join(text.rstrip("\n").split("\n")[-lines:])


Published = SampleReported | ProfileReported


@dataclass
class JobReports:
    """What one node of a job reported so far (see :mod:`shared.jobreport`)."""

    cmd: StartJob
    gpu_type: GpuType
    samples_done: float = 0.0
    finished: bool = False
    profiled: bool = False
    checkpointed: bool = False  # the latest line is a checkpoint (the job stopped)

    def apply(self, line: AnyReport, now: float | None = None) -> Published | None:
        """Take ``line`` in; the message to publish for it, if any
        (ValueError when its numbers make no valid sample or profile)."""
        at = time.time() if now is None else now
        self.checkpointed = isinstance(line, Checkpointed)
        if isinstance(line, Started | Progress | Checkpointed | Sampled | Finished):
            self.samples_done = line.samples_done
        if isinstance(line, Finished):
            self.finished = True
        elif isinstance(line, Sampled):
            return SampleReported(sample=self.sample(line), at=at)
        elif isinstance(line, Profiled):
            self.profiled = True
            return ProfileReported(report=self.profile(line), at=at)
        return None

    def sample(self, line: Sampled) -> ThroughputSample:
        config = self.cmd.configuration
        return ThroughputSample(
            job_id=self.cmd.job_id, server_id=self.cmd.server_id, gpu_type=self.gpu_type,
            local_gpus=len(self.cmd.gpu_indices), nodes=config.num_nodes,
            total_gpus=config.total_gpus, per_gpu_throughput=line.per_gpu_throughput,
            data_times=line.data_times, wait_times=line.wait_times,
            comm_times=line.comm_times, cores=line.cores)

    def profile(self, line: Profiled) -> ProfileReport:
        return ProfileReport(job_id=self.cmd.job_id, gpu_type=self.gpu_type,
                             server_id=self.cmd.server_id, modules=line.modules,
                             batch_size=line.batch_size,
                             signature=profile_signature(self.cmd.spec) or "")

    @property
    def done(self) -> bool:
        """The job said its work here is done (it is exiting)."""
        return self.finished or (self.cmd.mode == "profile" and self.profiled)


@dataclass(frozen=True)
class End:
    """How the processes of a job on this node ended: the exit code of each
    local rank (None: not known, the process was adopted), in the order
    they were seen to end."""

    exits: Mapping[int, int | None]
    adopted: bool = False
    log_tail: str = ""

    def failure(self) -> tuple[int, int] | None:
        """``(local rank, exit code)`` of the first rank that failed."""
        for rank, code in self.exits.items():
            if code is not None and code != 0:
                return rank, code
        return None


def verdict(reports: JobReports, end: End, node_rank: int, now: float,
            stopped: bool = False) -> JobFinished | JobFailed | None:
    """The event the job's end on this node calls for. After a stop
    (``stopped``) the stop's ack tells how it ended, except for a run whose
    node of rank 0 reported ``finished`` before the stop reached it (it was
    exiting): ``job_finished``, else the work would be requeued and done
    again from an older checkpoint. When nobody asked it to stop:

    * a rank exited non-zero (or by a signal, -N): ``job_failed``;
    * adopted processes ended on the node of rank 0 without a report that
      the work was done: ``job_failed`` (their exit codes cannot be known);
    * a run ended well on the node of rank 0: ``job_finished`` (with rank 0's
      exit code), unless its last report was a checkpoint (someone else
      stopped it; the monitor requeues it when the process is gone);
    * anything else (other nodes, a profiling run whose report is out): none.
    """
    cmd = reports.cmd
    if stopped:
        if cmd.mode == "run" and node_rank == 0 and reports.finished:
            return JobFinished(job_id=cmd.job_id, at=now, exit_code=end.exits.get(0),
                               log_tail=end.log_tail)
        return None
    where = f"on {cmd.server_id}"
    failed = end.failure()
    if failed is not None:
        code = failed[1]
        return JobFailed(job_id=cmd.job_id, at=now, exit_code=code, log_tail=end.log_tail,
                         reason=f"job process exited with code {code} {where}")
    if node_rank != 0:
        return None  # the node of rank 0 speaks for the job
    if end.adopted and not reports.done:
        return JobFailed(job_id=cmd.job_id, at=now, log_tail=end.log_tail,
                         reason=f"job process ended {where} after its executor restarted, "
                                "without reporting the end of its work; its exit code is "
                                "unknown")
    if cmd.mode != "run" or (reports.checkpointed and not reports.finished):
        return None
    return JobFinished(job_id=cmd.job_id, at=now, exit_code=end.exits.get(0),
                       log_tail=end.log_tail)
