"""The live half of the accuracy study: nats-server, two REAL executors and
the commands the placer would send them.

:class:`Executors` starts ``python -m executor --backend real`` for
``node-a`` and ``node-b`` (each device pinned to one core, one thread per
process, samples every ``sample_s``). :class:`Bus` is the study's NATS
connection: it creates the streams, answers the executors' registrations as
the monitor does (the monitor's registration reply, without its node
records and deadlines, which the study does not use), sends
``start_job``/``stop_job`` with a rendezvous as the placer does, and
collects ``profile_reported``, ``sample_reported`` and node heartbeats.
Each profiling run and each configuration's run waits for a quiet host
first and is repeated when other work took more than ``quiet`` of the CPUs
meanwhile (:mod:`bench.accuracy_host`).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.accuracy_host import Meter, Share
from executor.ledger import CONFLICT
from services.runtime.bus import connect, ensure_jetstream, request
from services.runtime.settings import RuntimeSettings
from shared import events as ev
from shared import subjects
from shared.configuration import Configuration
from shared.ids import ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample
from shared.node import Rendezvous, rendezvous_port

ROOT = Path(__file__).resolve().parents[1]
Jobs = list[tuple[JobSpec, Configuration]]
AFFINITY = "node-a=0|1;node-b=1"  # node-a's devices on cores 0 and 1, node-b's on core 1
SERVERS = (ServerId("node-a"), ServerId("node-b"))


@dataclass
class Executors:
    """The two executor processes (started and stopped by this study only)."""

    cluster_file: Path
    nats_url: str
    run_dir: Path
    sample_s: float
    profile_iters: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        """Start both executors, their output in ``run_dir``."""
        for server in SERVERS:
            log = (self.run_dir / f"executor-{server}.log").open("ab")
            argv = [sys.executable, "-m", "executor", "--backend", "real",
                    "--cluster", str(self.cluster_file), "--server-id", server,
                    "--cpu-affinity", AFFINITY, "--threads-per-gpu", "1",
                    "--run-dir", str(self.run_dir), "--sample-s", repr(self.sample_s),
                    "--profile-iters", str(self.profile_iters), "--nats-url", self.nats_url,
                    # a measurement on the operator's own machine: its jobs may run as
                    # whoever runs it, root included (docs/security.md, *Jobs*)
                    "--allow-root-jobs"]
            self.procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log,
                                               stdin=subprocess.DEVNULL))
            log.close()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to each executor (it stops its jobs first), then SIGKILL."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


@dataclass(frozen=True)
class Received:
    """A running-mode sample and when the study received it (monotonic)."""

    at: float
    sample: ThroughputSample


@dataclass(frozen=True)
class RunWindow:
    """One configuration's run: its samples (until the stop was sent), the
    wall-clock times of the start and of the stop, the CPU share other work
    took from the first sample to the stop (:mod:`bench.accuracy_host`) and
    in the quiet window before the start, and the runs it took."""

    samples: tuple[Received, ...]
    began: float
    ended: float
    share: Share
    foreign_before: float
    attempts: int = 1


@dataclass(frozen=True)
class Profiled:
    """A profiling run's report, the CPU share other work took from its
    start to its end and before it, and the runs it took."""

    report: ProfileReport
    share: Share
    foreign_before: float
    attempts: int = 1


@dataclass
class Bus:
    """The study's NATS connection (see the module docstring)."""

    nc: NATS
    meter: Meter
    quiet: float = 0.1  # the foreign CPU share above which a run is repeated
    tries: int = 3
    registered: set[ServerId] = field(default_factory=set)
    profiles: list[ProfileReport] = field(default_factory=list)
    samples: list[Received] = field(default_factory=list)
    running: dict[ServerId, tuple[str, ...]] = field(default_factory=dict)
    _starts: int = 0

    @classmethod
    async def open(cls, url: str, quiet: float, tries: int) -> Bus:
        """Connect, create the streams and subscribe (registrations, samples, beats)."""
        nc = await connect(RuntimeSettings(nats_servers=(url,), reconnect_wait=0.2), "accuracy")
        await ensure_jetstream(nc.jetstream())
        bus = cls(nc, Meter(), quiet, tries)
        await nc.subscribe(subjects.NODES_REGISTER_ALL, cb=bus._on_register)
        # No monitor relays the executors' reports here: read them at the source.
        await nc.subscribe(subjects.REPORTS_ALL, cb=bus._on_sample)
        await nc.subscribe(subjects.NODE_HEARTBEATS_ALL, cb=bus._on_beat)
        await nc.flush()
        return bus

    async def close(self) -> None:
        """Close the connection."""
        await self.nc.close()

    async def _on_register(self, msg: Msg) -> None:
        req = ev.decode_register(msg.data)
        self.registered.add(req.server.id)
        await msg.respond(ev.encode(ev.Reply(ok=True, server_id=req.server.id)))

    async def _on_sample(self, msg: Msg) -> None:
        event = ev.decode_report(msg.data)
        if isinstance(event, ev.SampleReported):
            self.samples.append(Received(time.monotonic(), event.sample))
        elif isinstance(event, ev.ProfileReported):
            self.profiles.append(event.report)

    async def _on_beat(self, msg: Msg) -> None:
        beat = ev.decode_node_heartbeat(msg.data)
        self.running[beat.server_id] = tuple(beat.running)

    async def until(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        """Wait until ``check()`` is true; TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout:.0f} s")
            await asyncio.sleep(0.1)

    async def ready(self, timeout: float = 60.0) -> None:
        """Both executors registered and beating."""
        await self.until("registration and heartbeats of both executors",
                         lambda: all(s in self.registered and s in self.running
                                     for s in SERVERS), timeout)

    async def idle(self, timeout: float = 60.0) -> None:
        """No job process runs on either server (by their node heartbeats)."""
        self.running.clear()
        await self.until("idle executors",
                         lambda: all(self.running.get(s) == () for s in SERVERS), timeout)

    def _start(self, spec: JobSpec, config: Configuration, server: ServerId, key: str,
               mode: Literal["run", "profile"]) -> ev.StartJob:
        gpus = config.as_dict()[server]
        meet = Rendezvous(master_addr="127.0.0.1",
                          master_port=rendezvous_port(f"{key}:{spec.id}"))
        return ev.StartJob(key=f"{key}:{server}", job_id=spec.id, server_id=server, spec=spec,
                           configuration=config, gpu_indices=tuple(range(gpus)), mode=mode,
                           rendezvous=meet)

    async def start(self, spec: JobSpec, config: Configuration,
                    mode: Literal["run", "profile"] = "run", timeout: float = 30.0) -> None:
        """``start_job`` on every server of ``config`` (lowest GPU indices).

        A profiling process keeps its GPU from its report until it exited,
        so a start refused everywhere with ``conflict`` is sent again (with
        a new key, as the placer's next plan would) until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            self._starts += 1
            key = f"study-{self._starts}"
            acks = await asyncio.gather(*(
                request(self.nc, subjects.exec_commands(s),
                        self._start(spec, config, s, key, mode), ev.decode_ack, timeout=30.0)
                for s in config.servers))
            failed = [a for a in acks if not a.ok]
            if not failed:
                return
            busy = len(failed) == len(acks) and all(a.code == CONFLICT for a in failed)
            if not busy or time.monotonic() > deadline:
                raise RuntimeError(f"start of {spec.id} on {config} refused: {failed[0].error}")
            await asyncio.sleep(0.2)

    async def stop(self, spec: JobSpec, config: Configuration) -> None:
        """``stop_job`` on every server of ``config``; returns once the processes ended."""
        self._starts += 1
        acks = await asyncio.gather(*(
            request(self.nc, subjects.exec_commands(s),
                    ev.StopJob(key=f"study-{self._starts}:{s}", job_id=spec.id,
                               reason="accuracy study"), ev.decode_ack, timeout=60.0)
            for s in config.servers))
        failed = [a for a in acks if not a.ok]
        if failed:
            raise RuntimeError(f"stop of {spec.id} on {config} refused: {failed[0].error}")

    async def _profile_once(self, spec: JobSpec, timeout: float) -> Profiled:
        config = Configuration.of({SERVERS[0]: 1})
        seen = len(self.profiles)
        before = await self.meter.quiet(self.quiet)
        a = self.meter.read()
        await self.start(spec, config, mode="profile")
        await self.until(f"profile of {spec.id}", lambda: len(self.profiles) > seen, timeout)
        await self.idle()
        return Profiled(self.profiles[seen], self.meter.share(a, self.meter.read()),
                        before.foreign)

    async def profile(self, spec: JobSpec, timeout: float = 300.0) -> Profiled:
        """A profiling run on node-a's device 0 (again, up to ``tries`` in
        all, while other work took more than ``quiet`` of the CPUs)."""
        tries: list[Profiled] = []
        while len(tries) < self.tries:
            tries.append(await self._profile_once(spec, timeout))
            if tries[-1].share.foreign <= self.quiet:
                break
        best = min(tries, key=lambda t: t.share.foreign)
        return replace(best, attempts=len(tries))

    async def _run_once(self, jobs: Jobs, seconds: float, timeout: float) -> RunWindow:
        seen = len(self.samples)
        servers = {s for _, config in jobs for s in config.servers}

        def servers_sampled() -> bool:
            return {r.sample.server_id for r in self.samples[seen:]} >= servers

        before = await self.meter.quiet(self.quiet)
        began = time.time()
        for spec, config in jobs:
            await self.start(spec, config)
        await self.until(f"first samples on {sorted(servers)}", servers_sampled, timeout)
        a = self.meter.read()
        await asyncio.sleep(seconds)
        taken, ended, share = tuple(self.samples[seen:]), time.time(), self.meter.share(
            a, self.meter.read())
        for spec, config in jobs:
            await self.stop(spec, config)
        await self.idle()
        return RunWindow(taken, began, ended, share, before.foreign)

    async def run(self, jobs: Jobs, seconds: float, timeout: float = 180.0) -> RunWindow:
        """Run each (job, configuration) of ``jobs`` side by side for
        ``seconds`` after every server's first sample; the samples received
        until the stop was sent (not the stop's partial last period). Run
        again, up to ``tries`` in all, while other work took more than
        ``quiet`` of the CPUs; the least disturbed run."""
        tries: list[RunWindow] = []
        while len(tries) < self.tries:
            tries.append(await self._run_once(jobs, seconds, timeout))
            if tries[-1].share.foreign <= self.quiet:
                break
        best = min(tries, key=lambda t: t.share.foreign)
        return replace(best, attempts=len(tries))
