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

One running job's processes are followed by :class:`executor.realjob.RealJob`;
this module decides whether and how jobs start, adopts them, and keeps the
state file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

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
from executor.backend import JobHandle, LostJobs, OnEnding, Refusal, StartFailed
from executor.isolation import FolderError, prepare_folders, root_refusal
from executor.launch import cores_of, job_paths, launches, relaxed_refusal
from executor.mba import MbaControl, MbaError
from executor.pinning import Pinner, write_count
from executor.ranks import AdoptedRank, LaunchError, start_ranks
from executor.realjob import RealJob, RealSettings, Sink
from executor.reports import JobReports, ReportTail
from executor.settle import settle
from shared.cluster import Server
from shared.events import INTERNAL, INVALID, StartJob
from shared.ids import GpuType, JobId
from shared.wire import FORBIDDEN

Spawner = Callable[[Coroutine[Any, Any, None], str], object]


class RealBackend:
    """Runs real jobs (see the module docstring)."""

    name = "real"
    alive = True  # the node runs while its executor does
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
        self._lost = LostJobs()

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
        self._lost.clear(cmd.job_id)
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
            self._lost.mark(rec.cmd.job_id)

    def lost(self) -> tuple[JobId, ...]:
        return self._lost.listed()

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
