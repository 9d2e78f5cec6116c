"""The node executor shell (EMULATED jobs): one process per server.

It serves ``hops.v1.exec.<server_id>`` (before registering, so that a node
the monitor lists takes commands), registers its server on
``hops.v1.nodes.register`` (retrying until the monitor answers; a refusal
stops it with exit code 1) and publishes a ``node_heartbeat`` listing its
running jobs every ``heartbeat_s``. Commands:

* ``start_job`` spawns ``python -m executor.job`` (see that module for the
  lead/worker/profile roles) and acknowledges once the process has sent its
  first heartbeat, so the monitor's deadline starts on a live job;
* ``stop_job`` sends SIGTERM, waits up to ``stop_grace_s`` (then SIGKILL) and
  acknowledges with the job's ``samples_done``.

The decisions (idempotency by key, conflicts, unknown jobs) are
:class:`executor.ledger.NodeLedger`'s. A job process that exits non-zero
without being asked to stop makes the executor publish ``job_failed``
(msg_id ``<job>:job_failed``, the same as the monitor's, so a failure is
recorded once). A start of a model the emulator does not know is refused
with ``invalid`` and fails the job (``job_failed``): no server can run it, and
it would otherwise wait for ever; a model that does not run on this
server's GPU type is only refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
from structlog.typing import FilteringBoundLogger

from executor.emulator import EmulationError, Role, UnknownModel, check_runnable, role_of
from executor.ledger import NodeLedger
from executor.serving import serve_commands
from services.runtime.bus import publish_event, request
from services.runtime.service import ServiceContext
from shared import subjects
from shared.cluster import Cluster
from shared.events import (
    INTERNAL,
    INVALID,
    Command,
    CommandAck,
    JobFailed,
    NodeHeartbeat,
    RegisterNode,
    StartJob,
    StopJob,
    WireError,
    decode_reply,
    encode,
)
from shared.ids import JobId, ServerId
from simulator.catalog import builtin_catalog
from simulator.truth import GroundTruth


@dataclass(frozen=True)
class ExecutorSettings:
    """See ``python -m executor --help`` and docs/events.md for the variables."""

    cluster: str
    server_id: ServerId
    order: int = 0
    time_scale: float = 1.0
    heartbeat_s: float = 1.0
    sample_s: float = 10.0
    stop_grace_s: float = 5.0
    start_timeout_s: float = 30.0
    profile_iters: int = 20
    register_retry_s: float = 1.0


class RegistrationRefused(RuntimeError):
    """The monitor refused this node (e.g. ``conflict``): a configuration error."""


class JobProcess:
    """One ``executor.job`` child: its progress as last reported, and its end."""

    def __init__(self, cmd: StartJob, role: Role, proc: asyncio.subprocess.Process,
                 log: FilteringBoundLogger, on_done: Callable[[], None]) -> None:
        self.cmd = cmd
        self.role = role
        self.proc = proc
        self.log = log
        self.samples_done = cmd.samples_done
        self.ready = asyncio.Event()
        self.exited = asyncio.Event()
        self.returncode: int | None = None
        self.on_done = on_done  # called on the process's "finished" line
        self.acked = False  # the start was acknowledged: its failures are the job's
        self.stopping = False  # a stop was asked for: its exit is no failure

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

    async def started(self, timeout: float) -> bool:
        """Wait for the first heartbeat; False if the process ended or hung."""
        ready = asyncio.create_task(self.ready.wait())
        ended = asyncio.create_task(self.exited.wait())
        _, pending = await asyncio.wait((ready, ended), timeout=timeout,
                                        return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return self.ready.is_set()

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


class NodeExecutor:
    """The executor of one server (see the module docstring)."""

    def __init__(self, ctx: ServiceContext, settings: ExecutorSettings, cluster: Cluster) -> None:
        self.ctx = ctx
        self.settings = settings
        self.cluster = cluster
        self.server = cluster.by_id[settings.server_id]
        self.truth = GroundTruth(cluster, builtin_catalog())
        self.ledger = NodeLedger(self.server)
        self.procs: dict[JobId, JobProcess] = {}
        self.log = ctx.log.bind(server_id=self.server.id)
        self._inflight: dict[str, asyncio.Future[CommandAck]] = {}
        # One lock per job, kept: a waiter may hold it when it is released.
        self._job_locks: dict[JobId, asyncio.Lock] = {}

    async def register(self) -> None:
        req = RegisterNode(server=self.server, gpu_type=self.cluster.type_by_name[
            self.server.gpu_type], order=self.settings.order, at=time.time())
        while not self.ctx.stopping.is_set():
            try:
                reply = await request(self.ctx.nc, subjects.NODES_REGISTER, req, decode_reply)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, WireError) as e:
                self.log.info("monitor not answering; retrying", error=repr(e))
                await asyncio.sleep(self.settings.register_retry_s)
                continue
            if not reply.ok:
                raise RegistrationRefused(f"registration refused ({reply.code}): {reply.error}")
            self.log.info("registered", gpus=self.server.gpus, gpu_type=self.server.gpu_type)
            return

    async def heartbeats(self) -> None:
        while not self.ctx.stopping.is_set():
            beat = NodeHeartbeat(server_id=self.server.id, at=time.time(),
                                 running=self.ledger.running())
            with contextlib.suppress(nats.errors.Error):
                await self.ctx.nc.publish(subjects.node_heartbeat(self.server.id), encode(beat))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ctx.stopping.wait(), self.settings.heartbeat_s)

    async def handle(self, cmd: Command) -> CommandAck:
        """Answer ``cmd``: once per key (a key in progress is awaited, not
        run twice), the commands of one job in order, other jobs alongside."""
        done = self.ledger.answered(cmd.key)
        if done is not None:
            self.log.info("repeated command", key=cmd.key, job_id=cmd.job_id)
            return done
        running = self._inflight.get(cmd.key)
        if running is not None:
            return await asyncio.shield(running)
        task = asyncio.ensure_future(self._one(cmd))
        self._inflight[cmd.key] = task
        task.add_done_callback(lambda _: self._inflight.pop(cmd.key, None))
        return await asyncio.shield(task)

    async def _one(self, cmd: Command) -> CommandAck:
        lock = self._job_locks.setdefault(cmd.job_id, asyncio.Lock())
        async with lock:
            ack = await (self._start(cmd) if isinstance(cmd, StartJob) else self._stop(cmd))
        self.log.info("command answered", key=cmd.key, job_id=cmd.job_id, ok=ack.ok,
                      code=ack.code, error=ack.error)
        return self.ledger.remember(ack)

    async def _start(self, cmd: StartJob) -> CommandAck:
        refusal = self.ledger.refuse_start(cmd)
        if refusal is not None:
            return refusal
        try:
            check_runnable(self.truth, cmd.spec.model, self.server.id)
        except EmulationError as e:
            if isinstance(e, UnknownModel):  # it cannot run anywhere: do not leave it waiting
                await self._fail(cmd.job_id, str(e))
            return CommandAck(key=cmd.key, ok=False, code=INVALID, error=str(e))
        role = role_of(cmd.mode, cmd.configuration, self.server.id)
        self.ledger.book(cmd)
        try:
            job = await self._spawn(cmd, role)
        except Exception:  # e.g. no more processes: nothing runs, nothing stays booked
            self.ledger.release(cmd.job_id)
            raise
        if not await job.started(self.settings.start_timeout_s):
            await job.terminate(self.settings.stop_grace_s)
            self.ledger.release(cmd.job_id)
            self.procs.pop(cmd.job_id, None)
            why = f"exit code {job.returncode}" if job.returncode is not None else "no heartbeat"
            return CommandAck(key=cmd.key, ok=False, code=INTERNAL,
                              error=f"job process did not start ({why})")
        job.acked = True
        return CommandAck(key=cmd.key, ok=True, samples_done=cmd.samples_done)

    async def _spawn(self, cmd: StartJob, role: Role) -> JobProcess:
        s = self.settings
        argv = [
            "-m", "executor.job", "--job-id", cmd.job_id, "--role", role,
            "--cluster", s.cluster, "--time-scale", repr(s.time_scale),
            "--heartbeat-s", repr(s.heartbeat_s), "--sample-s", repr(s.sample_s),
            "--profile-iters", str(s.profile_iters), "--nats-url", self.ctx.settings.nats_url,
            "--log-level", self.ctx.settings.log_level,
        ]
        # The command goes on stdin: a job spec may be longer than one argument may be.
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv,
                                                    stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(encode(cmd))
        proc.stdin.close()
        log = self.log.bind(job_id=cmd.job_id, role=role, pid=proc.pid)
        log.info("job process started", mode=cmd.mode, gpu_indices=list(cmd.gpu_indices),
                 samples_done=cmd.samples_done)
        job = JobProcess(cmd, role, proc, log, lambda: self.ledger.ending(cmd.job_id))
        self.procs[cmd.job_id] = job
        self.ctx.spawn(self._watch(job), name=f"job-{cmd.job_id}")
        return job

    async def _watch(self, job: JobProcess) -> None:
        """Follow a job process to its end; publish job_failed if it failed."""
        await job.pump()
        rc = job.returncode
        if self.procs.get(job.cmd.job_id) is job:
            del self.procs[job.cmd.job_id]
            self.ledger.release(job.cmd.job_id)
        if job.stopping or not job.acked:
            return
        if rc == 0:
            job.log.info("job process ended", samples_done=job.samples_done)
            return
        job.log.warning("job process failed", exit_code=rc)
        await self._fail(job.cmd.job_id, f"job process exited with code {rc} on "
                                         f"{self.server.id}")

    async def _fail(self, job_id: JobId, reason: str) -> None:
        """Publish ``job_failed`` (msg_id shared with the monitor: recorded once)."""
        event = JobFailed(job_id=job_id, at=time.time(), reason=reason)
        try:
            await publish_event(self.ctx.js, subjects.job_events(job_id), event,
                                msg_id=f"{job_id}:job_failed")
        except Exception as e:  # a failed process is still caught by the monitor
            self.log.warning("cannot publish job_failed", job_id=job_id, error=repr(e))

    async def _stop(self, cmd: StopJob) -> CommandAck:
        refusal = self.ledger.refuse_stop(cmd)
        if refusal is not None:
            return refusal
        job = self.procs.get(cmd.job_id)
        samples = 0.0
        if job is not None:
            await job.terminate(self.settings.stop_grace_s)
            samples = job.samples_done
            job.log.info("job stopped", reason=cmd.reason, samples_done=samples)
            self.procs.pop(cmd.job_id, None)
        self.ledger.release(cmd.job_id)
        return CommandAck(key=cmd.key, ok=True, samples_done=samples)

    async def shutdown(self) -> None:
        """Stop every job process (the node goes away with its jobs)."""
        jobs = list(self.procs.values())
        await asyncio.gather(*(j.terminate(self.settings.stop_grace_s) for j in jobs))


async def run_node(ctx: ServiceContext, settings: ExecutorSettings, cluster: Cluster) -> None:
    """The executor's ``main``: serve commands, register, beat until stopped."""
    node = NodeExecutor(ctx, settings, cluster)
    # Serve first: once the monitor lists the node, it takes commands.
    await serve_commands(ctx.nc, subjects.exec_commands(node.server.id), node.handle,
                         ctx.reporter)
    await node.register()
    if ctx.stopping.is_set():
        return
    ctx.spawn(node.heartbeats(), name="heartbeats")
    node.log.info("executor serving", subject=subjects.exec_commands(node.server.id),
                  time_scale=settings.time_scale)
    try:
        await ctx.stopping.wait()
    finally:
        await node.shutdown()
