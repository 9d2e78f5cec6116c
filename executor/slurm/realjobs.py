"""Real jobs under Slurm: a start runs the job's own command, one process
per GPU with the in-job plugin's environment (:mod:`executor.launch`, as
:mod:`executor.real` does), inside its Slurm batch job
(:mod:`executor.slurm.runner`), rather than the emulated job.

The job holds no NATS credential: its plugin writes its reports to the
job's report file (``<run>/<job>/reports/<server>.jsonl``), and the bridge
reads them (:class:`executor.reports.ReportTail`) and publishes its samples
and profile with its node's identity, and its heartbeats, as an executor
does for a real job. The checkpoint folder is the job's
(``<run>/<job>/checkpoint``), whichever node it runs on: the run folder
must be one every node reaches (a shared filesystem, as Slurm clusters
have). How the processes end is judged as under an executor
(:func:`executor.reports.verdict`): after Hops' stop the stop's ack says it
(the plugin checkpointed); a process that failed fails the job; the run
that said ``finished`` finishes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.backend import Outcome
from executor.launch import JobPaths, LaunchOptions, launches, world_of
from executor.realjob import Sink, forward
from executor.reports import End, JobReports, ReportTail, log_tail, verdict
from executor.slurm.handle import SlurmJobHandle
from executor.slurm.runner import launch_file
from shared.events import StartJob
from shared.ids import GpuType
from shared.slurm import JobVerdict


@dataclass(frozen=True)
class RealJobs:
    """What the bridge's real starts need: where their reports go, the
    launch options of the node (GPU type, report cadence) and the
    environment the jobs' processes inherit from (:func:`executor.isolation.base_env`)."""

    sink: Sink
    options: LaunchOptions
    base_env: dict[str, str]
    stop_grace_s: float


def report_offset(paths: JobPaths) -> int:
    """Where this start's report lines begin (earlier starts' are history)."""
    return paths.report.stat().st_size if paths.report.exists() else 0


def write_launches(cmd: StartJob, paths: JobPaths, folder: Path, real: RealJobs) -> Path:
    """The start's ``launch.json`` (:mod:`executor.slurm.runner`)."""
    plan = launches(cmd, real.options, paths, real.base_env)
    what = f"start {cmd.key} of job {cmd.job_id} on {cmd.server_id} ({cmd.mode}) in Slurm"
    path = folder / "launch.json"
    path.write_bytes(launch_file(what, plan, cmd.samples_done, real.stop_grace_s))
    return path


class SlurmRealHandle(SlurmJobHandle):
    """A real job's start in Slurm: Slurm's state as for any start
    (:class:`SlurmJobHandle`), its progress from its report file, its end
    judged from its processes' exit codes (the runner's ``exited`` line)."""

    beats_itself = False  # the bridge beats for it, as an executor for a real job

    def __init__(self, *args: Any, paths: JobPaths, offset: int, real: RealJobs,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.paths = paths
        self.sink = real.sink
        self.reports = JobReports(self.cmd, GpuType(real.options.gpu_type),
                                  samples_done=self.cmd.samples_done)
        self.tail_of_reports = ReportTail(paths.report, offset)
        self.exits: dict[int, int | None] = {}
        self._ending_said = False

    def _line(self, raw: bytes) -> None:
        try:
            line = json.loads(raw)
            event = line["event"]
        except (ValueError, KeyError, TypeError):
            return
        if event == "ready":
            self.ready = True
        elif event == "exited":
            self.exits = {int(k): v for k, v in dict(line.get("exits", {})).items()}

    async def take_in(self) -> None:
        self.read_output()
        await forward(self.tail_of_reports.read(final=bool(self.exits)), self.reports,
                      self.cmd, self.sink, self.log)
        self.samples_done = self.reports.samples_done
        if self.reports.done and not self._ending_said:
            self._ending_said = True
            self.last_event = "finished"  # a stop now gives it the grace to exit
            self.on_ending()

    def _outcome(self, verdict_: JobVerdict) -> Outcome:
        if verdict_.kind not in ("finished", "stopped") or not self.exits:
            return super()._outcome(verdict_)  # Slurm's end: failed, cancelled, lost
        failed = End(self.exits).failure()
        logs = self.paths.log(failed[0] if failed else 0)
        end = End(self.exits, log_tail=log_tail(logs))
        event = verdict(self.reports, end, world_of(self.cmd)[3], time.time(), self.stopping)
        return Outcome(exit_code=self.exits.get(0), log_tail=end.log_tail, event=event)

    def stop_details(self) -> tuple[int | None, str]:
        return self.exits.get(0), log_tail(self.paths.log(0))
