"""The REAL backend: runs a job's own command, one process per GPU.

A start runs ``spec.command`` once per GPU of this server's part of the
configuration (a profiling run: once), in one process group, in
``spec.workdir``, as the job user, in the clean environment of
:mod:`executor.launch` (:mod:`executor.isolation`), and is
acknowledged as soon as the processes are spawned. From then on the
executor speaks for the job, which knows nothing of NATS: it publishes the
job's heartbeats with the progress read from the job's report file
(:mod:`executor.reports`), its samples and its profile, and when the
processes end, ``job_finished`` or ``job_failed`` with the exit code and the
end of the log (:func:`executor.reports.verdict`).

A stop sends SIGTERM to the group (the job writes a checkpoint and exits
0), and SIGKILL to the group after the grace period. When one process
fails, the others of the job on this node are stopped the same way.

Each job holding cores is pinned to the core ids its booking names
(:mod:`executor.pinning`): at the start, again every ``PIN_EVERY_S`` while
it runs, and at once on a ``set_cores``, which also rewrites the job's
``HOPS_CORES_FILE``. A job's MBA cap (``mba_percent``, CODA §V-D) is kept
on its threads the same way (:mod:`executor.mba`); a start whose cap cannot
be set up is refused (``internal``).

Jobs outlive the executor: it keeps a state file (:mod:`executor.adopt`)
and, when it starts again, adopts the jobs still running and reports as
lost those whose processes ended meanwhile (``node_heartbeat.lost``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from structlog.typing import FilteringBoundLogger

from executor.adopt import (
    ExecutorState,
    LaunchRecord,
    StateError,
    load_state,
    running,
    save_state,
    state_path,
    triage,
)
from executor.backend import (
    JobHandle,
    OnEnding,
    Outcome,
    Refusal,
    StartFailed,
    profile_msg_id,
    with_cap,
)
from executor.cores import with_cores
from executor.isolation import FolderError, JobIdentity, prepare_folders, root_refusal
from executor.launch import LaunchOptions, cores_of, job_paths, launches, relaxed_refusal, world_of
from executor.mba import JobCap, MbaControl, MbaError
from executor.membw import RESCTRL
from executor.pinning import Pinner, write_count
from executor.ranks import (
    AdoptedRank,
    LaunchError,
    Rank,
    kill_stragglers,
    signal_group,
    start_ranks,
)
from executor.reports import End, JobReports, ReportTail, log_tail, verdict
from executor.settle import settle
from shared.cluster import Server
from shared.events import INTERNAL, INVALID, ProfileReported, Report, SampleReported, StartJob
from shared.ids import GpuType, JobId
from shared.wire import FORBIDDEN

Spawner = Callable[[Coroutine[Any, Any, None], str], object]
LOST_LISTED_S = 30.0  # how long node heartbeats list a lost job


class Sink(Protocol):
    """Where a real job's messages go (:class:`executor.publish.NatsSink`)."""

    async def sample(self, msg: SampleReported) -> None: ...

    def event(self, job_id: str, msg: Report, msg_id: str) -> None: ...


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
        for line in self.tail.read(final):
            try:
                msg = self.reports.apply(line)
            except ValueError as e:
                self.log.warning("report line not usable", kind=type(line).__name__, error=str(e))
                continue
            if isinstance(msg, SampleReported):
                await self.sink.sample(msg)
            elif isinstance(msg, ProfileReported):
                self.sink.event(self.cmd.job_id, msg, profile_msg_id(self.cmd))
                self.log.info("job profiled", gpu_type=msg.report.gpu_type)
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


class RealBackend:
    """Runs real jobs (see the module docstring)."""

    name = "real"
    models: tuple[str, ...] = ()  # any: it runs and profiles whatever it is given

    def __init__(self, server: Server, settings: RealSettings, sink: Sink,
                 log: FilteringBoundLogger, spawn_task: Spawner,
                 base_env: dict[str, str] | None = None) -> None:
        self.server = server
        self.settings = settings
        self.sink = sink
        self.log = log
        self.spawn_task = spawn_task
        self.base_env = dict(os.environ) if base_env is None else base_env
        self.gpu_type = GpuType(settings.options.gpu_type)
        self.jobs: dict[JobId, RealJob] = {}
        self.state_file = state_path(settings.run_dir, server.id)
        self._saved: ExecutorState | None = None
        self._lost: dict[JobId, float] = {}  # job -> when it was found lost (monotonic)

    def check(self, cmd: StartJob) -> Refusal | None:
        spec = cmd.spec
        why = root_refusal(self.settings.identity, os.geteuid())
        if why is not None:  # the executor refuses to start so; this is the backstop
            self.log.error("start refused: jobs would run as root", job_id=cmd.job_id,
                           error=why)
            return Refusal(FORBIDDEN, f"executor {self.server.id}: {why}")
        if not spec.command:
            return Refusal(INVALID, f"job {cmd.job_id} has no command; executor "
                                    f"{self.server.id} runs real jobs", fail_job=True)
        if (why := relaxed_refusal(cmd)) is not None:
            return Refusal(INVALID, f"executor {self.server.id}: {why}")
        if spec.workdir and not Path(spec.workdir).is_dir():
            return Refusal(INVALID, f"working folder {spec.workdir} does not exist on "
                                    f"{self.server.id}", fail_job=True)
        if cmd.configuration.mba_percent < 100:  # its group now: no job starts uncappable
            try:
                MbaControl(self.settings.resctrl).group(cmd.configuration.mba_percent)
            except MbaError as e:
                return Refusal(INTERNAL, f"executor {self.server.id}: {e}")
        return None

    async def spawn(self, cmd: StartJob, on_ending: OnEnding,
                    cores: tuple[int, ...] = ()) -> JobHandle:
        self._lost.pop(cmd.job_id, None)  # it runs here again: no longer lost
        paths = job_paths(self.settings.run_dir, cmd.job_id, self.server.id)
        ident = self.settings.identity
        log = self.log.bind(job_id=cmd.job_id)
        what = f"start {cmd.key} of job {cmd.job_id} on {self.server.id} ({cmd.mode})"
        try:
            prepare_folders(paths.root, (paths.logs, paths.checkpoint, paths.report.parent),
                            (paths.report,), ident)
            # Only what this start writes counts: earlier starts' lines are history.
            offset = paths.report.lstat().st_size if paths.report.exists() else 0
            write_count(paths.cores, cores_of(cmd))
            plan = launches(cmd, self.settings.options, paths, self.base_env, ident, cores)
            ranks, pgid = start_ranks(plan, what)
        # FolderError, FileExistsError: the job tampered with its folder.
        except (LaunchError, FolderError, FileExistsError) as e:
            error = f"cannot start job {cmd.job_id} on {self.server.id}: {e}"
            log.warning("job command cannot start", error=str(e), argv=list(cmd.spec.command))
            raise StartFailed(error) from None
        reports = JobReports(cmd, self.gpu_type, samples_done=cmd.samples_done)
        job = RealJob(cmd, list(ranks), pgid, reports, ReportTail(paths.report, offset),
                      tuple(launch.log for launch in plan), log.bind(pgid=pgid), self.sink,
                      on_ending, self.settings, pinner=Pinner(pgid, cores, paths.cores))
        job.pinner.pin()  # threads the ranks started before each was pinned
        if job.cap.due() and (why := job.cap.keep()) is not None:  # and capped
            log.warning("job's memory bandwidth cap not set", error=why)
        log.info("job processes started", mode=cmd.mode, pgid=pgid, pids=[r.pid for r in ranks],
                 user=ident.name, gpu_indices=list(cmd.gpu_indices), cores=cores_of(cmd),
                 core_ids=list(cores), mba_percent=cmd.configuration.mba_percent,
                 samples_done=cmd.samples_done,
                 workdir=cmd.spec.workdir or os.getcwd())
        self._follow(job)
        return job

    def _follow(self, job: RealJob) -> None:
        self.jobs[job.cmd.job_id] = job
        self._save()
        self.spawn_task(job.run(), f"job-{job.cmd.job_id}")

    async def recover(self, on_ending: Callable[[JobId], OnEnding]) -> list[JobHandle]:
        try:
            state = load_state(self.state_file, self.server.id)
        except StateError as e:
            aside = self.state_file.with_suffix(".unreadable")
            self.log.error("state file unreadable; starting without it", error=str(e),
                           moved_to=str(aside))
            self.state_file.replace(aside)
            return []
        adopt, gone = triage(state.jobs, lambda r: running(r.pid, r.start_time))
        for rec in gone:
            self._settle(rec)
        handles: list[JobHandle] = []
        for rec in adopt:
            job = self._adopt(rec, on_ending(rec.cmd.job_id))
            handles.append(job)
        self._save()
        return handles

    def _adopt(self, rec: LaunchRecord, on_ending: OnEnding) -> RealJob:
        cmd = rec.cmd
        reports = JobReports(cmd, self.gpu_type, samples_done=rec.samples_done,
                             finished=rec.finished, profiled=rec.profiled)
        log = self.log.bind(job_id=cmd.job_id, pgid=rec.pgid)
        paths = job_paths(self.settings.run_dir, cmd.job_id, self.server.id)
        job = RealJob(cmd, [AdoptedRank(r) for r in rec.ranks], rec.pgid, reports,
                      ReportTail(Path(rec.report_file), rec.offset),
                      tuple(Path(p) for p in rec.logs), log, self.sink, on_ending,
                      self.settings, adopted=True,
                      pinner=Pinner(rec.pgid, rec.cores, paths.cores))
        log.info("job adopted", pids=[r.pid for r in rec.ranks], samples_done=rec.samples_done,
                 report_offset=rec.offset)
        self._follow(job)
        return job

    def _settle(self, rec: LaunchRecord) -> None:
        log = self.log.bind(job_id=rec.cmd.job_id, pgid=rec.pgid)
        if not settle(rec, self.gpu_type, self.sink, log):
            self._lost[rec.cmd.job_id] = time.monotonic()

    def lost(self) -> tuple[JobId, ...]:
        now = time.monotonic()
        for job in [j for j, t in self._lost.items() if now - t > LOST_LISTED_S]:
            del self._lost[job]
        return tuple(sorted(self._lost))

    def forget(self, job: JobHandle) -> None:
        if self.jobs.get(job.cmd.job_id) is job:
            del self.jobs[job.cmd.job_id]
            self._save()

    async def tick(self) -> None:
        self._save()  # offsets and progress, for an adoption after a crash

    async def close(self) -> None:
        self._save()

    def _save(self) -> None:
        state = ExecutorState(server_id=self.server.id,
                              jobs=tuple(j.record() for j in self.jobs.values()))
        if state != self._saved:
            save_state(self.state_file, state)
            self._saved = state
