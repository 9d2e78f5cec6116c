"""``python -m executor.job``: one EMULATED job process, started by a node
executor (:mod:`executor.service`) for a ``start_job`` command.

It trains nothing. By role (:func:`executor.emulator.role_of`):

* ``lead`` advances the job at the ground-truth rate times the time scale
  from the command's ``samples_done``, sends a ``job_heartbeat`` every
  ``--heartbeat-s``, publishes running-mode ``sample_reported`` (its
  server's ThroughputSample, §3.2) every ``--sample-s``, and on reaching
  ``total_samples`` publishes ``job_finished`` (JetStream, msg_id
  ``<job>:job_finished``) and exits 0;
* ``worker`` (another server of a distributed configuration) heartbeats and
  publishes its own server's samples on the same clock, until it is stopped;
* ``profile`` runs the ground truth's profiling run of the job on this
  server (§3.2, profiling mode), heartbeating, then publishes
  ``profile_reported`` and exits 0.

Everything goes to subjects of the job's server (``cmd.server_id``), the
only ones that server's NATS identity may use: heartbeats on
``hops.v1.jobs.heartbeat.<server>.<job>``, reports on
``hops.v1.reports.<server>.<job>`` (the monitor relays them). So each
process reports only its own server's samples: the monitor refuses a
report whose payload names another server than its subject.

SIGTERM or SIGINT stops the job: it prints its progress and exits 0. When its
executor dies, the process notices that it was re-parented and exits 3
without reporting anything, as a job on a lost node would.

The ``start_job`` command comes on stdin as JSON (in ``--command-file``
under Slurm). Stdout is the channel back to the executor: one JSON object
per line,
``{"event": "ready" | "progress" | "finished" | "stopped", "samples_done": x}``;
``ready`` follows the first heartbeat. Logs go to stderr as JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import msgspec
import nats.errors
import numpy as np
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from structlog.typing import FilteringBoundLogger

from executor.backend import profile_msg_id
from executor.cores import with_cores
from executor.emulator import (
    Cadence,
    Role,
    job_seed,
    log_line_end,
    log_line_start,
    log_line_step,
    profile_wall_s,
    run_progress,
    sample_iterations,
)
from services.runtime.bus import connect, publish_event
from services.runtime.logging import configure_logging, get_logger
from services.runtime.settings import from_env
from shared import jobenv, subjects
from shared.events import (
    JobFinished,
    JobHeartbeat,
    ProfileReported,
    Report,
    SampleReported,
    StartJob,
    decode_command,
    encode,
)
from shared.reuse import profile_signature
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.truth import GroundTruth

EXIT_ORPHANED = 3
_TICK_S = 0.25  # longest sleep: bounds how late a stop or a lost parent is seen
_PUBLISH_TRIES = 120  # with 0.5 s between tries: a minute of NATS trouble
_LOG_S = 3.0  # a training-log line this often (wall seconds): few, but a live log


class ParentGone(Exception):
    """The executor that started this process is gone."""


@dataclass
class JobContext:
    cmd: StartJob
    role: Role
    truth: GroundTruth
    time_scale: float
    heartbeat_s: float
    sample_s: float
    profile_iters: int
    nc: NATS
    js: JetStreamContext
    stop: asyncio.Event
    log: FilteringBoundLogger
    parent: int
    out: TextIO | None = None  # the rank's log file (executor.logship ships it)

    def say(self, text: str) -> None:
        """One line of the job's own output (its log file; none: nowhere)."""
        if self.out is not None:
            with contextlib.suppress(OSError):
                self.out.write(f"{text}\n")
                self.out.flush()

    def say_start(self, done: float) -> None:
        cmd = self.cmd
        self.say(log_line_start(cmd.job_id, cmd.spec.model, cmd.server_id, self.role, done,
                                float(cmd.spec.total_samples)))

    def emit(self, event: str, samples_done: float) -> None:
        """One line to the executor; a closed pipe means it is gone."""
        if os.getppid() != self.parent:
            raise ParentGone()
        try:
            print(json.dumps({"event": event, "samples_done": samples_done}), flush=True)
        except BrokenPipeError:
            raise ParentGone() from None

    async def beat(self, samples_done: float, first: bool = False) -> None:
        """A job heartbeat. The first one is flushed, since the executor
        acknowledges the start on it; a later one that cannot go out (NATS is
        reconnecting) is dropped: a beat is only worth sending on time."""
        msg = JobHeartbeat(job_id=self.cmd.job_id, server_id=self.cmd.server_id,
                           samples_done=samples_done, at=time.time())
        try:
            await self.nc.publish(subjects.job_heartbeat(self.cmd.server_id, self.cmd.job_id),
                                  encode(msg))
            if first:
                await self.nc.flush()
        except nats.errors.Error as e:
            if first:
                raise
            self.log.warning("heartbeat not sent", error=repr(e))

    async def publish(self, msg: Report, msg_id: str) -> None:
        """A JetStream publish of a report, retried while NATS is unavailable."""
        subject = subjects.reports(self.cmd.server_id, self.cmd.job_id)
        for attempt in range(_PUBLISH_TRIES):
            try:
                await publish_event(self.js, subject, msg, msg_id=msg_id, timeout=2.0)
                return
            except Exception as e:
                if attempt == _PUBLISH_TRIES - 1:
                    raise
                self.log.warning("publish failed; retrying", subject=subject, error=repr(e))
                await asyncio.sleep(0.5)

    async def nap(self, seconds: float) -> None:
        """Sleep up to ``seconds`` (at most one tick), waking on a stop."""
        if os.getppid() != self.parent:
            raise ParentGone()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), min(_TICK_S, max(0.01, seconds)))


class CoresFollower:
    """The cores this job holds here, followed from the file the executor
    rewrites on a ``set_cores`` (``HOPS_CORES_FILE``): a change gives the
    emulated run a new rate from the samples done (the other servers' cores
    as at the start: each executor tells its own process)."""

    def __init__(self, path: str | None, count: int) -> None:
        self.path = Path(path) if path else None
        self.count = count

    def changed(self) -> int | None:
        if self.path is None:
            return None
        try:
            count = int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None
        if count == self.count:
            return None
        self.count = count
        return count


async def run_lead(job: JobContext) -> int:
    cmd = job.cmd
    progress = run_progress(job.truth, cmd.spec, cmd.configuration, cmd.samples_done,
                            job.time_scale)
    cores = CoresFollower(os.environ.get(jobenv.CORES_FILE),
                          cmd.configuration.cores_on(cmd.server_id))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    beat = Cadence(job.heartbeat_s)
    sample = Cadence(job.sample_s, next_at=job.sample_s)
    rng = np.random.default_rng(job_seed(cmd.job_id, cmd.key))
    reported = progress.start
    first = True
    said = Cadence(_LOG_S, next_at=_LOG_S)
    job.say_start(progress.start)
    while True:
        elapsed = loop.time() - t0
        done = progress.at(elapsed)
        if (count := cores.changed()) is not None:  # in place: a new rate from here
            cmd = with_cores(cmd, count)
            progress = run_progress(job.truth, cmd.spec, cmd.configuration, done,
                                    job.time_scale)
            t0 = loop.time() - elapsed  # the cadences keep their clock
            progress = replace(progress, start=done - progress.rate * elapsed)
            job.log.info("job cores changed", cores=count)
        if beat.due(elapsed):  # first: the start is acknowledged on the first beat
            await job.beat(done, first)
            job.emit("ready" if first else "progress", done)
            first = False
        if progress.done(elapsed):
            await job.publish(JobFinished(job_id=cmd.job_id, at=time.time()),
                              msg_id=f"{cmd.job_id}:job_finished")
            job.log.info("job finished", samples_done=done, wall_s=elapsed)
            job.say(log_line_end(done, "finished"))
            job.emit("finished", done)
            return 0
        if job.stop.is_set():
            job.say(log_line_end(done, "stopped"))
            job.emit("stopped", done)
            return 0
        if said.due(elapsed):
            job.say(log_line_step(done, progress.total, progress.rate / job.time_scale,
                                  cmd.spec.batch_size))
        if sample.due(elapsed):
            await _report_samples(job, done - reported, rng)
            reported = done
        wake = min(beat.next_at, sample.next_at, said.next_at,
                   elapsed + progress.remaining_s(elapsed))
        await job.nap(wake - elapsed)


async def _report_samples(job: JobContext, samples: float, rng: np.random.Generator) -> None:
    """This server's running-mode report of the last period (§3.2)."""
    cmd = job.cmd
    iters = sample_iterations(samples, cmd.spec.batch_size, cmd.configuration.total_gpus)
    for s in job.truth.running_samples(cmd.job_id, cmd.spec.model, cmd.configuration, iters,
                                       rng):
        if s.server_id != cmd.server_id:
            continue  # the other servers' processes report theirs
        # Core publish: the subject is on HOPS_REPORTS, and a lost sample only
        # costs the estimator one observation, so the job does not wait on acks.
        try:
            await job.nc.publish(subjects.reports(cmd.server_id, cmd.job_id),
                                 encode(SampleReported(sample=s, at=time.time())))
        except nats.errors.Error as e:
            job.log.warning("sample not sent", error=repr(e))


async def run_worker(job: JobContext) -> int:
    cmd = job.cmd
    # The lead's progress, followed only to report this server's samples.
    progress = run_progress(job.truth, cmd.spec, cmd.configuration, cmd.samples_done,
                            job.time_scale)
    beat = Cadence(job.heartbeat_s)
    sample = Cadence(job.sample_s, next_at=job.sample_s)
    rng = np.random.default_rng(job_seed(cmd.job_id, cmd.key))
    reported = progress.start
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = True
    job.say_start(cmd.samples_done)
    while not job.stop.is_set():
        elapsed = loop.time() - t0
        if beat.due(elapsed):
            await job.beat(cmd.samples_done, first)
            job.emit("ready" if first else "progress", cmd.samples_done)
            first = False
        if sample.due(elapsed) and not progress.done(elapsed):
            done = progress.at(elapsed)
            await _report_samples(job, done - reported, rng)
            reported = done
        await job.nap(min(beat.next_at, sample.next_at) - elapsed)
    job.say(log_line_end(cmd.samples_done, "stopped"))
    job.emit("stopped", cmd.samples_done)
    return 0


async def run_profile(job: JobContext) -> int:
    cmd = job.cmd
    rng = np.random.default_rng(job_seed(cmd.job_id, cmd.key))
    report, seconds = job.truth.profile(cmd.job_id, cmd.spec.model, cmd.server_id,
                                       job.profile_iters, rng)
    # What the real executor's report carries too (executor.reports).
    report = msgspec.structs.replace(report, signature=profile_signature(cmd.spec) or "")
    wall = profile_wall_s(seconds, job.time_scale)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    beat = Cadence(job.heartbeat_s)
    first = True
    job.say_start(0.0)
    while (elapsed := loop.time() - t0) < wall:
        if job.stop.is_set():
            job.emit("stopped", 0.0)
            return 0
        if beat.due(elapsed):
            await job.beat(0.0, first)
            job.emit("ready" if first else "progress", 0.0)
            first = False
        await job.nap(min(beat.next_at, wall) - elapsed)
    msg_id = profile_msg_id(cmd)
    await job.publish(ProfileReported(report=report, at=time.time()), msg_id=msg_id)
    job.log.info("job profiled", gpu_type=report.gpu_type, wall_s=wall)
    job.say(log_line_end(0.0, "profiled"))
    job.emit("finished", 0.0)
    return 0


ROLES = {"lead": run_lead, "worker": run_worker, "profile": run_profile}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="executor.job",
                                description="One emulated job process (see the module).")
    p.add_argument("--job-id", required=True, help="the job (its start_job command, as JSON, "
                   "comes on stdin)")
    p.add_argument("--role", required=True, choices=sorted(ROLES))
    p.add_argument("--cluster", required=True, help="built-in cluster name or cluster file")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--profile-iters", type=int, default=20)
    p.add_argument("--nats-url", default=None, help="overrides $HOPS_NATS_URL")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-file", default=None, help="the rank's log file (appended to)")
    p.add_argument("--command-file", default=None,
                   help="read the start_job command from this file, not stdin (a Slurm "
                        "batch job has no stdin of Hops')")
    return p


async def _run(args: argparse.Namespace, cmd: StartJob, truth: GroundTruth) -> int:
    settings = from_env()
    if args.nats_url:
        # The executor's own credential and CA come with its environment.
        settings = replace(settings, nats_servers=tuple(args.nats_url.split(",")))
    log = get_logger(job_id=cmd.job_id, server_id=cmd.server_id, role=args.role)
    nc = await connect(settings, f"job-{cmd.job_id}@{cmd.server_id}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    job = JobContext(cmd, args.role, truth, args.time_scale, args.heartbeat_s, args.sample_s,
                     args.profile_iters, nc, nc.jetstream(), stop, log, os.getppid(),
                     _open_log(args.log_file))
    try:
        return await ROLES[args.role](job)
    except ParentGone:
        log.warning("executor gone; exiting without a report")
        return EXIT_ORPHANED
    finally:
        if job.out is not None:
            job.out.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2.0)


def _open_log(path: str | None) -> TextIO | None:
    """The rank's log file, appended to (None: none given, or it cannot be made)."""
    if not path:
        return None
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a", encoding="utf-8")
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging("executor-job", args.log_level, stream=sys.stderr)
    raw = Path(args.command_file).read_bytes() if args.command_file else sys.stdin.buffer.read()
    cmd = decode_command(raw)
    if not isinstance(cmd, StartJob) or cmd.job_id != args.job_id:
        where = args.command_file or "stdin"
        raise SystemExit(f"{where} must hold the start_job command of job {args.job_id}")
    truth = GroundTruth(cluster_arg(args.cluster), builtin_catalog())
    return asyncio.run(_run(args, cmd, truth))


if __name__ == "__main__":
    sys.exit(main())
