"""One real job's processes on this node, followed to their end.

:class:`RealJob` is the handle :class:`executor.real.RealBackend` keeps per
job: it watches the job's ranks and report file, forwards its samples and
profile, keeps its core pinning and MBA cap, escalates SIGTERM to SIGKILL on a
stop or a failed rank, and judges the job's end. It stands apart from the
backend, which decides whether and how a job starts and keeps the state file
for adoption; the job needs only its settings (:class:`RealSettings`) and the
sink its messages go to (:class:`Sink`).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from executor.adopt import LaunchRecord
from executor.backend import OnEnding, Outcome, profile_msg_id, with_cap
from executor.cores import with_cores
from executor.isolation import JobIdentity
from executor.launch import LaunchOptions, world_of
from executor.mba import JobCap, MbaControl
from executor.membw import RESCTRL
from executor.pinning import Pinner
from executor.ranks import Rank, kill_stragglers, signal_group
from executor.reports import End, JobReports, ReportTail, log_tail, verdict
from shared.events import ProfileReported, Report, SampleReported, StartJob
from shared.jobreport import AnyReport


class Sink(Protocol):
    """Where a real job's messages go (:class:`executor.publish.NatsSink`)."""

    async def sample(self, msg: SampleReported) -> None: ...

    def event(self, job_id: str, msg: Report, msg_id: str) -> None: ...


async def forward(lines: Iterable[AnyReport], reports: JobReports, cmd: StartJob, sink: Sink,
                  log: FilteringBoundLogger) -> None:
    """Apply a job's new report lines (:class:`JobReports`) and pass what they
    say on: samples to the estimator, a profile once per start. A line that
    cannot be used is logged and skipped."""
    for line in lines:
        try:
            msg = reports.apply(line)
        except ValueError as e:
            log.warning("report line not usable", kind=type(line).__name__, error=str(e))
            continue
        if isinstance(msg, SampleReported):
            await sink.sample(msg)
        elif isinstance(msg, ProfileReported):
            sink.event(cmd.job_id, msg, profile_msg_id(cmd))
            log.info("job profiled", gpu_type=msg.report.gpu_type)


@dataclass(frozen=True)
class RealSettings:
    """The real backend's settings (see ``python -m executor --help``)."""

    run_dir: Path
    options: LaunchOptions
    identity: JobIdentity  # who the jobs run as (executor.isolation)
    stop_grace_s: float = 5.0
    poll_s: float = 0.2
    resctrl: Path = RESCTRL  # where MBA caps are written (executor.mba)


class RealJob:
    """The processes of one job on this node, followed to their end."""

    beats_itself = False

    def __init__(self, cmd: StartJob, ranks: list[Rank], pgid: int, reports: JobReports,
                 tail: ReportTail, logs: tuple[Path, ...], log: FilteringBoundLogger,
                 sink: Sink, on_ending: OnEnding, settings: RealSettings,
                 adopted: bool = False, pinner: Pinner | None = None,
                 cap: JobCap | None = None) -> None:
        self.cmd = cmd
        self.ranks = ranks
        self.pgid = pgid
        self.reports = reports
        self.tail = tail
        self.logs = logs
        self.log = log
        self.sink = sink
        self.on_ending = on_ending
        self.settings = settings
        self.adopted = adopted
        self.pinner = pinner or Pinner(pgid, (), None)
        self.cap = cap or JobCap(MbaControl(settings.resctrl), pgid,
                                 cmd.configuration.mba_percent)
        self.node_rank = world_of(cmd)[3]
        self.stopping = False
        self._exits: dict[int, int | None] = {}  # local rank -> exit code, in order of ending
        self._signalled = False  # SIGTERM went to the group (a stop, or a failed rank)
        self._kill_at: float | None = None  # when the group gets SIGKILL
        self._ending_said = False
        self._done = asyncio.Event()
        self._outcome = Outcome(exit_code=None)

    @property
    def samples_done(self) -> float:
        return self.reports.samples_done

    async def started(self, timeout: float) -> str | None:
        return None  # spawned is started: a script may take long to import its framework

    @property
    def cores(self) -> tuple[int, ...]:
        return self.pinner.cores

    def retune(self, count: int, cores: tuple[int, ...], mba_percent: int = 100) -> None:
        """Cap first: an :class:`executor.mba.MbaError` leaves cap and cores as they were."""
        moved = self.cap.set(mba_percent)
        self.cmd = self.reports.cmd = with_cap(with_cores(self.cmd, count), mba_percent)
        try:
            threads = self.pinner.change(cores, count)
        except OSError as e:  # e.g. the job replaced its folder: it keeps its old count
            self.log.warning("job not told its new cores", error=str(e))
            threads = 0
        self.log.info("job cores changed", cores=count, core_ids=list(cores), threads=threads,
                      mba_percent=mba_percent, capped_threads=moved)

    async def run(self) -> None:
        """Follow the reports and the processes until every process ended."""
        loop = asyncio.get_running_loop()
        try:
            while not self._poll():
                await self._read()
                self._after_failure()
                if self.pinner.due():
                    self.pinner.pin()
                if self.cap.due() and (why := self.cap.keep()) is not None:
                    self.log.warning("job's memory bandwidth cap not kept", error=why)
                if self._kill_at is not None and loop.time() >= self._kill_at:
                    self.log.warning("job processes ignored SIGTERM; killing the group")
                    signal_group(self.pgid, signal.SIGKILL)
                    self._kill_at = None
                await asyncio.sleep(self.settings.poll_s)
            await self._read(final=True)
            if self._signalled:
                kill_stragglers(self.pgid)
            self._outcome = self._judge()
        finally:
            self.cap.end()
            self._done.set()

    def _poll(self) -> bool:
        """Note the ranks that ended; True once all did."""
        for rank in self.ranks:
            if rank.local_rank in self._exits:
                continue
            ended, code = rank.ended()
            if ended:
                self._exits[rank.local_rank] = code
                self.log.info("job process ended", local_rank=rank.local_rank, pid=rank.pid,
                              exit_code=code)
        return len(self._exits) == len(self.ranks)

    async def _read(self, final: bool = False) -> None:
        """Take in the new report lines."""
        skipped = self.tail.skipped
        await forward(self.tail.read(final), self.reports, self.cmd, self.sink, self.log)
        if self.tail.skipped > skipped:
            self.log.warning("unreadable report lines skipped", count=self.tail.skipped - skipped)
        if self.reports.done and not self._ending_said:
            self._ending_said = True
            self.on_ending()

    def _after_failure(self) -> None:
        """A rank that failed (or, adopted, ended) takes the others down."""
        if self._signalled or self.stopping or not self._exits:
            return
        if End(self._exits).failure() is None and not self.adopted:
            return
        if self.adopted and self.reports.done:
            return  # the work is done: the others are exiting too
        self.log.warning("a job process ended early; stopping the job's other processes",
                         exits=dict(self._exits))
        self._escalate(self.settings.stop_grace_s)

    def _escalate(self, grace: float) -> None:
        self._signalled = True
        signal_group(self.pgid, signal.SIGTERM)
        self._kill_at = asyncio.get_running_loop().time() + grace

    def _judge(self) -> Outcome:
        failed = End(self._exits).failure()
        log_of = failed[0] if failed is not None else 0
        tail = log_tail(self.logs[log_of]) if log_of < len(self.logs) else ""
        end = End(self._exits, adopted=self.adopted, log_tail=tail)
        event = verdict(self.reports, end, self.node_rank, time.time(), self.stopping)
        return Outcome(exit_code=self._exits.get(0), log_tail=tail, event=event)

    async def terminate(self, grace: float) -> None:
        """SIGTERM to the group, SIGKILL after ``grace``; returns once all ended."""
        self.stopping = True
        if not self._done.is_set() and not self._signalled:
            self._escalate(grace)
        try:
            await self._done.wait()
        except asyncio.CancelledError:  # the executor is going: leave nothing behind
            signal_group(self.pgid, signal.SIGKILL)
            raise

    async def wait(self) -> Outcome:
        await self._done.wait()
        return self._outcome

    def stop_details(self) -> tuple[int | None, str]:
        return self._exits.get(0), log_tail(self.logs[0]) if self.logs else ""

    def record(self) -> LaunchRecord:
        return LaunchRecord(cmd=self.cmd, pgid=self.pgid,
                            ranks=tuple(r.record() for r in self.ranks),
                            report_file=str(self.tail.path), logs=tuple(map(str, self.logs)),
                            offset=self.tail.offset, samples_done=self.reports.samples_done,
                            finished=self.reports.finished, profiled=self.reports.profiled,
                            cores=self.pinner.cores)
