"""A real job whose processes ended while its executor was away.

When the executor starts again (:mod:`executor.adopt`), a recorded job
with a process gone cannot go on: its ranks wait for each other. What is
left of its group is killed, and its report file, read to the end, tells
an end from a loss: a job that said it finished gets its ``job_finished``
(from the node of global rank 0), one that did not is *lost* (listed in
the node's heartbeats, so the monitor releases it at once). A profile
written meanwhile is still sent; samples that old are not.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from executor.adopt import LaunchRecord, group_members, running
from executor.backend import profile_msg_id
from executor.launch import world_of
from executor.ranks import signal_group
from executor.reports import JobReports, ReportTail, log_tail
from shared.events import JobFinished, ProfileReported, Report
from shared.ids import GpuType


class EventSink(Protocol):
    def event(self, job_id: str, msg: Report, msg_id: str) -> None: ...


def settle(rec: LaunchRecord, gpu_type: GpuType, sink: EventSink,
           log: FilteringBoundLogger) -> bool:
    """Settle ``rec`` (see the module); True when the job ended, False when lost."""
    cmd = rec.cmd
    if any(running(r.pid, r.start_time) for r in rec.ranks) and group_members(rec.pgid):
        log.warning("some of the job's processes ended while the executor was away; "
                    "killing the others")
        signal_group(rec.pgid, signal.SIGKILL)
    reports = JobReports(cmd, gpu_type, samples_done=rec.samples_done,
                         finished=rec.finished, profiled=rec.profiled)
    for line in ReportTail(Path(rec.report_file), rec.offset).read(final=True):
        try:
            msg = reports.apply(line)
        except ValueError:
            continue
        if isinstance(msg, ProfileReported):  # samples this old are not worth sending
            sink.event(cmd.job_id, msg, profile_msg_id(cmd))
    tail = log_tail(Path(rec.logs[0])) if rec.logs else ""
    if reports.done:
        if cmd.mode == "run" and world_of(cmd)[3] == 0:
            event = JobFinished(job_id=cmd.job_id, at=time.time(), log_tail=tail)
            sink.event(cmd.job_id, event, f"{cmd.job_id}:job_finished")
        log.info("job ended while the executor was away", samples_done=reports.samples_done)
        return True
    log.warning("job lost: its processes ended while the executor was away",
                samples_done=reports.samples_done, log_tail=tail[-500:])
    return False
