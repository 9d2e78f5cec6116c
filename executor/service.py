"""The node executor shell: one process per server, whatever runs its jobs.

It serves ``hops.v1.exec.<server_id>`` (before registering, so that a node
the monitor lists takes commands), registers its server on
``hops.v1.nodes.register.<server_id>`` (with its rendezvous address and devices;
retrying until the monitor answers; a refusal stops it with exit code 1)
and publishes a ``node_heartbeat`` listing its running jobs every
``heartbeat_s``, and the ``job_heartbeat`` of every job that does not beat
itself or is being stopped. Commands:

* ``start_job``: the ledger's checks, then the backend's
  (:meth:`executor.backend.Backend.check`); the backend spawns the job and
  the start is acknowledged once :meth:`~executor.backend.JobHandle.started`
  says so (emulated: the first heartbeat; real: spawned);
* ``stop_job``: SIGTERM, SIGKILL after ``stop_grace_s``; acknowledged with
  the job's ``samples_done`` (and, for real jobs, the exit code and log tail);
* ``set_cores``: the running job's cores and MBA cap change in place: the
  ledger re-books them (or refuses, changing nothing); the job is re-pinned,
  capped and told its count (a cap it cannot take: ``internal``, no change).

A real executor without ``--cpu-affinity`` pins jobs to cores of its own
affinity (:mod:`executor.cores`, :mod:`executor.pinning`; the acks name
them); with it, the operator's cores win. Through resctrl it reads the
node's memory bandwidth and MBA (:mod:`executor.membw`: its heartbeats,
its server's ``mba``) and caps jobs (:mod:`executor.mba`, CODA §V-D).

Every subject it publishes on names its server (NATS permissions let an
executor's identity use no other): job heartbeats on
``hops.v1.jobs.heartbeat.<server_id>.<job_id>`` and job events on
``hops.v1.reports.<server_id>.<job_id>``, which the monitor relays (see
:mod:`executor.publish`); its jobs' output on ``hops.v1.logs.<server_id>.<job_id>``
(:mod:`executor.logship`). It does not create streams (``serve(...,
ensure_streams=False)``): its identity has no JetStream API.

The decisions (idempotency by key, conflicts, unknown jobs) are
:class:`executor.ledger.NodeLedger`'s. A job whose processes end without
being asked to stop gets the event its backend's outcome names
(:mod:`executor.ends`: ``job_failed`` with msg_id ``<job>:job_failed``, the
monitor's id for the same verdict, so a failure is recorded once;
``job_finished``). A start the
backend refuses as impossible anywhere (an unknown model, no command, a
missing working folder, a program that cannot be run) is refused with
``invalid`` and fails the job: it would otherwise wait for ever.

It follows the Hare task sequences the scheduler leader sends its server
(:mod:`executor.taskrun`: run on the emulated backend, refused on the real one).

The backends are :mod:`executor.emulated` and :mod:`executor.real`; the
settings, :mod:`executor.settings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import msgspec
import nats.errors

from executor.backend import Backend, CommandRefused, JobHandle, OnEnding, Refusal, StartFailed
from executor.cores import core_pool, load_topology
from executor.emulated import EmulatedBackend
from executor.ends import JobEnds
from executor.launch import LaunchOptions
from executor.ledger import NodeLedger
from executor.logship import LogShipper
from executor.mba import MbaError
from executor.membw import NodeMemory
from executor.publish import NatsSink
from executor.real import RealBackend
from executor.realjob import RealSettings
from executor.serving import serve_commands
from executor.settings import ExecutorSettings, advertised, job_identity
from executor.taskrun import start_tasks
from services.runtime.bus import request
from services.runtime.service import ServiceContext
from shared import subjects
from shared.cluster import Cluster
from shared.events import (
    ALREADY_STARTED,
    INTERNAL,
    INVALID,
    Command,
    CommandAck,
    JobFinished,
    JobHeartbeat,
    NodeHeartbeat,
    RegisterNode,
    SetCores,
    StartJob,
    StopJob,
    WireError,
    decode_reply,
    encode,
)
from shared.ids import JobId


class RegistrationRefused(RuntimeError):
    """The monitor refused this node (e.g. ``conflict``): a configuration error."""


def make_backend(ctx: ServiceContext, settings: ExecutorSettings, cluster: Cluster) -> Backend:
    """The backend ``settings.backend`` names."""
    server = advertised(settings, cluster)
    log = ctx.log.bind(server_id=server.id)
    if settings.backend == "real":
        options = LaunchOptions(gpu_type=server.gpu_type, sample_s=settings.sample_s,
                                profile_iters=settings.profile_iters, threads=settings.threads,
                                affinity=settings.affinity)
        ident = settings.job_identity or job_identity(settings)
        real = RealSettings(run_dir=settings.run_dir, options=options, identity=ident,
                            stop_grace_s=settings.stop_grace_s, resctrl=settings.resctrl)
        return RealBackend(server, real, NatsSink(ctx.nc, ctx.js, server.id, log, ctx.spawn),
                           log, ctx.spawn)
    s = settings
    job_args = ["--time-scale", repr(s.time_scale), "--heartbeat-s", repr(s.heartbeat_s),
                "--sample-s", repr(s.sample_s), "--profile-iters", str(s.profile_iters),
                "--nats-url", ctx.settings.nats_url, "--log-level", ctx.settings.log_level]
    return EmulatedBackend(server, s.cluster, job_args, log, ctx.spawn, run_dir=s.run_dir)


class NodeExecutor:
    """The executor of one server (see the module docstring)."""

    def __init__(self, ctx: ServiceContext, settings: ExecutorSettings, cluster: Cluster,
                 backend: Backend) -> None:
        self.ctx = ctx
        self.settings = settings
        self.cluster = cluster
        self.backend = backend
        self.server = advertised(settings, cluster)
        self.log = ctx.log.bind(server_id=self.server.id)
        real = settings.backend == "real"
        self.memory = NodeMemory(real, settings.resctrl)  # emulated ones share a host: none
        if real:  # before the ledger, which refuses a cap where there is no MBA
            self.server = msgspec.structs.replace(self.server, mba=self.memory.resctrl.mba)
            (self.log.info if self.memory.resctrl.mba else self.log.warning)(
                self.memory.resctrl.describe())
        pool = core_pool(real, bool(settings.affinity))
        nvml = any(d.source == "nvml" for d in settings.devices)
        self.ledger = NodeLedger(self.server, pool=pool,
                                 topology=load_topology(os.cpu_count() or 1) if nvml else None)
        self.procs: dict[JobId, JobHandle] = {}
        self._inflight: dict[str, asyncio.Future[CommandAck]] = {}
        # One lock per job, kept: a waiter may hold it when it is released.
        self._job_locks: dict[JobId, asyncio.Lock] = {}
        self.shipper = LogShipper(ctx.js, self.server.id, settings.run_dir, self.log,
                                  settings.log_cap_bytes_s, settings.log_cap_burst_bytes)
        self.ends = JobEnds(ctx.js, self.server.id, self.procs, self.ledger, self.shipper,
                            backend, self.log)

    async def register(self) -> None:
        req = RegisterNode(server=self.server, gpu_type=self.cluster.type_by_name[
            self.server.gpu_type], order=self.settings.order, at=time.time(),
            address=self.settings.address, devices=self.settings.devices,
            models=self.backend.models)
        while not self.ctx.stopping.is_set():
            try:
                reply = await request(self.ctx.nc, subjects.nodes_register(self.server.id), req,
                                      decode_reply)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, WireError) as e:
                self.log.info("monitor not answering; retrying", error=repr(e))
                await asyncio.sleep(self.settings.register_retry_s)
                continue
            if not reply.ok:
                raise RegistrationRefused(f"registration refused ({reply.code}): {reply.error}")
            self.log.info("registered", gpus=self.server.gpus, gpu_type=self.server.gpu_type,
                          cores=self.server.cores, memory_gb=self.server.memory_gb,
                          backend=self.backend.name, address=self.settings.address)
            return

    async def recover(self) -> None:
        """Book the jobs the backend adopted from before a restart (before
        any command is served: a stop for one of them must find it)."""
        for job in await self.backend.recover(self._ending):
            cmd = job.cmd
            self.ledger.book(cmd, cores=job.cores)
            # A retried start of the adopted run is answered, not refused as a conflict.
            self.ledger.remember(CommandAck(key=cmd.key, ok=True, samples_done=cmd.samples_done))
            self.ends.follow(job)
            acked: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            acked.set_result(True)
            self.ctx.spawn(self.ends.watch(job, acked), name=f"watch-{cmd.job_id}")

    def _ending(self, job_id: JobId) -> OnEnding:
        return lambda: self.ledger.ending(job_id)

    async def heartbeats(self) -> None:
        while not self.ctx.stopping.is_set():
            if self.backend.alive:  # else silent: the monitor finds the node dead
                await self._beat()
            await self.backend.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ctx.stopping.wait(), self.settings.heartbeat_s)

    async def _beat(self) -> None:
        now = time.time()
        beat = NodeHeartbeat(server_id=self.server.id, at=now,
                             running=self.ledger.running(), lost=self.backend.lost(),
                             memory_bandwidth_gbps=self.memory.gbps())
        with contextlib.suppress(nats.errors.Error):
            await self.ctx.nc.publish(subjects.node_heartbeat(self.server.id), encode(beat))
            for job in list(self.procs.values()):
                # A real job knows nothing of NATS. A job being stopped falls
                # silent while it stops (it may take up to the stop grace, or be
                # slow to exit on a busy host) yet is still listed here: the
                # executor vouches for it, so the monitor never judges a stop in
                # progress a hung process and fails the job.
                if not job.beats_itself or job.stopping:
                    msg = JobHeartbeat(job_id=job.cmd.job_id, server_id=self.server.id,
                                       samples_done=job.samples_done, at=now)
                    subject = subjects.job_heartbeat(self.server.id, job.cmd.job_id)
                    await self.ctx.nc.publish(subject, encode(msg))

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
            if isinstance(cmd, StartJob):
                ack = await self._start(cmd)
            elif isinstance(cmd, SetCores):
                ack = self._set_cores(cmd)
            else:
                ack = await self._stop(cmd)
        self.log.info("command answered", key=cmd.key, job_id=cmd.job_id, ok=ack.ok,
                      code=ack.code, error=ack.error)
        return self.ledger.remember(ack)

    async def _start(self, cmd: StartJob) -> CommandAck:
        same = self.ledger.same_start(cmd)
        if same is not None:  # a new placer starting what its predecessor started
            running = self.procs.get(cmd.job_id)
            self.log.info("the job already runs as asked", job_id=cmd.job_id, key=cmd.key,
                          started_by=same.key)
            return CommandAck(key=cmd.key, ok=True, code=ALREADY_STARTED, started_by=same.key,
                              samples_done=running.samples_done if running else cmd.samples_done,
                              cores=same.cores, gpu_indices=same.gpu_indices)
        if (refusal := self.ledger.refuse_start(cmd)) is not None:
            return refusal
        no = self.backend.check(cmd)
        if no is not None:
            if no.fail_job:
                await self.ends.fail(cmd.job_id, no.error)
            return CommandAck(key=cmd.key, ok=False, code=no.code, error=no.error)
        booking = self.ledger.book(cmd)
        try:
            job = await self.backend.spawn(cmd, self._ending(cmd.job_id), booking.cores)
        except CommandRefused as e:  # not now (Slurm away or saying no): the job waits
            self.ledger.release(cmd.job_id)
            return CommandAck(key=cmd.key, ok=False, code=e.code, error=e.words)
        except StartFailed as e:  # the job's program cannot run: not here, not anywhere
            self.ledger.release(cmd.job_id)
            await self.ends.fail(cmd.job_id, e.error, e.exit_code, e.log_tail)
            return CommandAck(key=cmd.key, ok=False, code=INVALID, error=e.error,
                              exit_code=e.exit_code, log_tail=e.log_tail)
        except Exception:  # e.g. no more processes: nothing runs, nothing stays booked
            self.ledger.release(cmd.job_id)
            raise
        self.ends.follow(job)
        acked: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.ctx.spawn(self.ends.watch(job, acked), name=f"watch-{cmd.job_id}")
        why: str | Refusal | None = "the start was interrupted"
        try:
            why = await job.started(self.settings.start_timeout_s)
        finally:  # the watcher waits on this, whatever happens here
            acked.set_result(why is None)
        if why is not None:
            await job.terminate(self.settings.stop_grace_s)
            self.ends.forget(job)
            code, error = (why.code, why.error) if isinstance(why, Refusal) else (INTERNAL, why)
            return CommandAck(key=cmd.key, ok=False, code=code, error=error)
        return CommandAck(key=cmd.key, ok=True, samples_done=cmd.samples_done,
                          cores=booking.cores)

    def _set_cores(self, cmd: SetCores) -> CommandAck:
        """The job's cores and cap change in place (see the module docstring)."""
        if (refusal := self.ledger.refuse_retune(cmd)) is not None:
            return refusal
        job, log = self.procs.get(cmd.job_id), self.log.bind(job_id=cmd.job_id)
        log.info("set_cores", cores=cmd.cores, mba_percent=cmd.mba_percent)
        try:
            booking = self.ledger.retune(cmd, job.retune if job is not None else None)
        except MbaError as e:  # nothing changed: the job keeps its cores and its cap
            return CommandAck(key=cmd.key, ok=False, code=INTERNAL, error=f"{self.server.id}: {e}")
        return CommandAck(key=cmd.key, ok=True, cores=booking.cores,
                          samples_done=job.samples_done if job is not None else 0.0)

    async def _stop(self, cmd: StopJob) -> CommandAck:
        if (refusal := self.ledger.refuse_stop(cmd)) is not None:
            return refusal
        job = self.procs.get(cmd.job_id)
        samples, exit_code, tail = 0.0, None, ""
        if job is not None:
            try:
                await job.terminate(self.settings.stop_grace_s)
            except CommandRefused as e:  # it runs on, booked: the placer keeps its GPUs
                job.log.warning("stop refused", code=e.code, error=e.words)
                return CommandAck(key=cmd.key, ok=False, code=e.code, error=e.words)
            samples = job.samples_done
            exit_code, tail = job.stop_details()
            job.log.info("job stopped", reason=cmd.reason, samples_done=samples,
                         exit_code=exit_code)
            finished = (await job.wait()).event
            if isinstance(finished, JobFinished):
                # It had done its work and was exiting: said before the ack, as a
                # job that ends by itself says it, so the job is not run again.
                job.log.info("job finished before the stop", samples_done=samples)
                await self.ends.report(finished, f"{cmd.job_id}:job_finished", job.log)
            self.ends.forget(job)
        self.ledger.release(cmd.job_id)
        return CommandAck(key=cmd.key, ok=True, samples_done=samples, exit_code=exit_code,
                          log_tail=tail)

    async def shutdown(self) -> None:
        """Stop every job (the node goes away with its jobs), keep the rest."""
        jobs = list(self.procs.values())
        ended = await asyncio.gather(*(j.terminate(self.settings.stop_grace_s) for j in jobs),
                                     return_exceptions=True)
        for job, end in zip(jobs, ended, strict=True):
            if isinstance(end, CommandRefused):  # runs on: the next executor adopts it
                job.log.warning("job left running", code=end.code, error=end.words)
            elif isinstance(end, BaseException):
                raise end
            else:
                self.ends.forget(job)
        with contextlib.suppress(Exception):  # their last lines, while NATS is still there
            await asyncio.wait_for(self.shipper.ship_all(), self.settings.stop_grace_s)
        await self.backend.close()


async def run_node(ctx: ServiceContext, settings: ExecutorSettings, cluster: Cluster,
                   backend: Backend | None = None) -> None:
    """The executor's ``main``: adopt, serve commands, register, beat until
    stopped; with ``backend`` (the Slurm bridge's), rather than the one the
    settings name."""
    node = NodeExecutor(ctx, settings, cluster,
                        backend or make_backend(ctx, settings, cluster))
    await node.recover()
    # Serve first: once the monitor lists the node, it takes commands.
    await serve_commands(ctx.nc, subjects.exec_commands(node.server.id), node.handle,
                         ctx.reporter)
    await start_tasks(ctx, node.server, node.backend, settings)  # Hare's sequences
    await node.register()
    if ctx.stopping.is_set():
        return
    ctx.spawn(node.heartbeats(), name="heartbeats")
    ctx.spawn(node.shipper.run(ctx.stopping), name="logs")
    node.log.info("executor serving", subject=subjects.exec_commands(node.server.id),
                  backend=settings.backend, time_scale=settings.time_scale)
    try:
        await ctx.stopping.wait()
    finally:
        await node.shutdown()
