"""The EMULATED backend: each job is one ``python -m executor.job`` process
(see that module for the lead/worker/profile roles) that trains nothing.

The start is acknowledged once the process has sent its first heartbeat, so
the monitor's deadline starts on a live job. The process publishes its own
heartbeats, samples, profile and ``job_finished``; it reports progress to
the executor on stdout. A model the emulator does not know is refused and
fails the job (no server could run it); a model that does not run on this
server's GPU type is only refused. The process writes a few lines of a
training log to its rank's log file, as a real job would print them, for
:mod:`executor.logship` to ship. The job process gets ``HOPS_CORES``,
the CPU cores it holds, as a real job does. An emulated job does not outlive its
executor (it notices it was re-parented and exits), so nothing is adopted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from structlog.typing import FilteringBoundLogger

from executor.backend import JobHandle, OnEnding, Outcome, Refusal, with_cap
from executor.cores import with_cores
from executor.emulator import EmulationError, Role, UnknownModel, check_runnable, role_of
from executor.launch import cores_of, job_paths
from shared import jobenv
from shared.cluster import Server
from shared.events import INVALID, JobFailed, StartJob, encode
from shared.ids import JobId
from shared.jobkeys import path_name
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.truth import GroundTruth

Spawner = Callable[[Coroutine[Any, Any, None], str], object]


class JobProcess:
    """One ``executor.job`` child: its progress as last reported, and its end."""

    beats_itself = True

    def __init__(self, cmd: StartJob, role: Role, proc: asyncio.subprocess.Process,
                 log: FilteringBoundLogger, on_done: OnEnding) -> None:
        self.cmd = cmd
        self.role = role
        self.proc = proc
        self.log = log
        self.samples_done = cmd.samples_done
        self.ready = asyncio.Event()
        self.exited = asyncio.Event()
        self.returncode: int | None = None
        self.on_done = on_done  # called on the process's "finished" line
        self.stopping = False  # a stop was asked for: its exit is no failure
        self.cores: tuple[int, ...] = ()  # emulated jobs train nothing: never pinned
        self.cores_file: Path | None = None

    def retune(self, count: int, cores: tuple[int, ...], mba_percent: int = 100) -> None:
        """The books change, and the process learns the new count from its
        cores file (it emulates its rate at the cores it holds). A memory
        bandwidth cap (CODA §V-D) is only logged: emulated jobs share one
        host and train nothing, and no resctrl group is theirs to join."""
        self.cmd = with_cap(with_cores(self.cmd, count), mba_percent)
        if mba_percent < 100:
            self.log.info("memory bandwidth cap noted, not applied (emulated)",
                          mba_percent=mba_percent)
        if self.cores_file is not None:
            write_count(self.cores_file, count)

    async def pump(self) -> None:
        """Read the progress lines until the process ends."""
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
                self.samples_done = float(line["samples_done"])
                if line["event"] == "ready":
                    self.ready.set()
                elif line["event"] == "finished":
                    self.on_done()
            except (ValueError, KeyError, TypeError):
                self.log.warning("unreadable line from job process", line=raw[:200].decode(
                    "utf-8", errors="replace"))
        self.returncode = await self.proc.wait()
        self.exited.set()

    async def started(self, timeout: float) -> str | None:
        """Wait for the first heartbeat; the reason when the process ended or hung."""
        ready = asyncio.create_task(self.ready.wait())
        ended = asyncio.create_task(self.exited.wait())
        _, pending = await asyncio.wait((ready, ended), timeout=timeout,
                                        return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if self.ready.is_set():
            return None
        why = f"exit code {self.returncode}" if self.returncode is not None else "no heartbeat"
        return f"job process did not start ({why})"

    async def terminate(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once it ended."""
        self.stopping = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            await asyncio.wait_for(self.exited.wait(), grace)
        except TimeoutError:
            self.log.warning("job process ignored SIGTERM; killing it")
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.exited.wait()

    async def wait(self) -> Outcome:
        """The process's end: a non-zero exit is the job's failure (the lead
        published its own ``job_finished`` on success)."""
        await self.exited.wait()
        rc = self.returncode
        if rc == 0:
            return Outcome(exit_code=0)
        reason = f"job process exited with code {rc} on {self.cmd.server_id}"
        return Outcome(exit_code=rc, event=JobFailed(job_id=self.cmd.job_id, at=time.time(),
                                                     reason=reason, exit_code=rc))

    def stop_details(self) -> tuple[int | None, str]:
        return None, ""  # an emulated job's exit says nothing about the job


class EmulatedBackend:
    """Runs emulated jobs (see the module docstring)."""

    name = "emulated"
    alive = True  # the node runs while its executor does

    def __init__(self, server: Server, cluster: str, job_args: list[str],
                 log: FilteringBoundLogger, spawn_task: Spawner,
                 run_dir: Path | None = None) -> None:
        self.server = server
        self.run_dir = run_dir  # where each job's lines go (None: nowhere)
        self.cluster = cluster
        self.job_args = job_args  # the flags every executor.job gets (time scale, NATS, ...)
        self.log = log
        self.spawn_task = spawn_task
        self.truth = GroundTruth(cluster_arg(cluster), builtin_catalog())
        self.models = tuple(sorted(builtin_catalog()))
        # Each job's core count, which a set_cores rewrites (jobenv.CORES_FILE).
        self.cores_dir = Path(tempfile.mkdtemp(prefix=f"hops-emulated-{server.id}-"))

    def check(self, cmd: StartJob) -> Refusal | None:
        if cmd.spec.kind == "cpu":
            return None  # a CPU job runs on any server with its cores
        try:
            check_runnable(self.truth, cmd.spec.model, self.server.id)
        except EmulationError as e:
            # An unknown model cannot run anywhere: do not leave it waiting.
            return Refusal(INVALID, str(e), fail_job=isinstance(e, UnknownModel))
        return None

    async def spawn(self, cmd: StartJob, on_ending: OnEnding,
                    cores: tuple[int, ...] = ()) -> JobHandle:
        role = role_of(cmd.mode, cmd.configuration, self.server.id)
        argv = ["-m", "executor.job", "--job-id", cmd.job_id, "--role", role,
                "--cluster", self.cluster, *self.job_args]
        if self.run_dir is not None:  # rank 0's log, as a real job's (executor.logship)
            argv += ["--log-file", str(job_paths(self.run_dir, cmd.job_id, self.server.id).log(0))]
        count = cores_of(cmd)  # ``cores`` is empty: an emulated executor pins nothing
        cores_file = self.cores_dir / path_name(f"{cmd.job_id}-{cmd.key}.cores")
        write_count(cores_file, count)
        env = os.environ | {jobenv.CORES: str(count), jobenv.CORES_FILE: str(cores_file)}
        # The command goes on stdin: a job spec may be longer than one argument may be.
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv,
                                                    stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(encode(cmd))
        proc.stdin.close()
        log = self.log.bind(job_id=cmd.job_id, role=role, pid=proc.pid)
        log.info("job process started", mode=cmd.mode, gpu_indices=list(cmd.gpu_indices),
                 cores=count, samples_done=cmd.samples_done,
                 mba_percent=cmd.configuration.mba_percent)
        job = JobProcess(cmd, role, proc, log, on_ending)
        job.cores_file = cores_file
        self.spawn_task(job.pump(), f"job-{cmd.job_id}")
        return job

    async def recover(self, on_ending: Callable[[JobId], OnEnding]) -> list[JobHandle]:
        return []  # emulated jobs die with their executor

    def lost(self) -> tuple[JobId, ...]:
        return ()

    def forget(self, job: JobHandle) -> None:
        pass

    async def tick(self) -> None:
        pass

    async def close(self) -> None:
        shutil.rmtree(self.cores_dir, ignore_errors=True)


def write_count(path: Path, count: int) -> None:
    """Replace ``path``'s content with ``count`` at once (a reader never
    sees it half written)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{count}\n")
    tmp.replace(path)
