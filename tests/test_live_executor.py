"""The EMULATED node executor against a real nats-server and real processes:
registration, start/stop/idempotency over NATS, emulated progress, profiling,
failures of the job process, and the ``--all`` supervisor.

Also the helpers the other live tests share (process handling, a NATS
client that collects messages, waiting on conditions)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from executor.procs import emulated_job_pids
from services.runtime.bus import connect, ensure_jetstream, request
from services.runtime.settings import RuntimeSettings
from shared import events as ev
from shared import subjects
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.records import JobPhase, JobRecord, NodeRecord, Placement
from shared.snapshot import Assignment, Plan
from tests.helpers import exited
from tests.natsfix import nats_server, nats_url
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

__all__ = ["nats_server", "nats_url"]  # fixtures

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "paper-physical"
S0 = ServerId("rtx3090-sugon-0")
S1 = ServerId("rtx3090-sugon-1")
MODEL = "resnet18-cifar10"
HEARTBEAT_S = 0.5
TIMEOUT_S = 2.0
T = TypeVar("T")


# --- shared helpers -----------------------------------------------------------------


async def eventually(
    condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"{what} never held"
        await asyncio.sleep(0.05)


def spec(
    job: str, total: float = 1e12, model: str = MODEL, reqs: tuple[int, ...] = (1, 2, 4)
) -> JobSpec:
    return JobSpec(JobId(job), model, 256, 11_181_642, int(total), requirements=reqs)


class Procs:
    """Service processes of one test, logging to files, stopped at the end."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        full_env = {
            **os.environ,
            "HOPS_NATS_URL": self.url,
            "HOPS_HEARTBEAT_S": str(HEARTBEAT_S),
            "HOPS_HEARTBEAT_TIMEOUT_S": str(TIMEOUT_S),
            "HOPS_METRICS_PORT": "off",
            "HOPS_QUEUE_POLL_S": "0.5",
            "HOPS_SAMPLE_S": "0.5",
            **env,
        }
        log = (self.tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[name] = proc
        return proc

    def monitor(self, **env: str) -> subprocess.Popen[bytes]:
        return self.start("monitor", "services.monitor", **env)

    def executor(self, server: str, time_scale: float = 1.0, **env: str) -> subprocess.Popen[bytes]:
        return self.start(
            f"executor-{server}",
            "executor",
            "--cluster",
            CLUSTER,
            "--server-id",
            server,
            "--time-scale",
            str(time_scale),
            **env,
        )

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def procs(nats_url: str, tmp_path: Path) -> Iterator[Procs]:
    p = Procs(nats_url, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


class Client:
    """A test's own NATS connection: requests, KV reads and collected messages."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js = nc.jetstream()

    async def collect(self, subject: str, decode: Callable[[bytes], T]) -> list[T]:
        seen: list[T] = []

        async def on_msg(msg: Msg) -> None:
            seen.append(decode(msg.data))

        await self.nc.subscribe(subject, cb=on_msg)
        await asyncio.sleep(0)
        await self.nc.flush()
        return seen

    async def command(self, server: str, cmd: ev.Command, timeout: float = 15.0) -> ev.CommandAck:
        return await request(
            self.nc, subjects.exec_commands(server), cmd, ev.decode_ack, timeout=timeout
        )

    async def kv_get(self, bucket: str, key: str, kind: type[T]) -> T | None:
        kv = await self.js.key_value(bucket)
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return msgspec.json.decode(entry.value or b"", type=kind)

    async def kv_put(self, bucket: str, key: str, value: Any) -> None:
        await (await self.js.key_value(bucket)).put(key, msgspec.json.encode(value))

    async def wait_node(self, server: str, alive: bool = True, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            rec = await self.kv_get(subjects.KV_NODES, server, NodeRecord)
            if rec is not None and rec.alive == alive:
                return
            assert time.monotonic() < deadline, f"node {server} never became alive={alive}"
            await asyncio.sleep(0.1)

    async def put_job(
        self, job_spec: JobSpec, phase: JobPhase = "queued", samples: float = 0.0
    ) -> None:
        rec = JobRecord(
            spec=job_spec, submitted_at=time.time(), phase=phase, samples_done=samples
        )
        await self.kv_put(subjects.KV_JOBS, job_spec.id, rec)

    async def placement(self, job: str) -> Placement | None:
        return await self.kv_get(subjects.KV_ALLOC, job, Placement)


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[Client]:
    nc = await connect(RuntimeSettings(nats_servers=(nats_url,), reconnect_wait=0.1), "test")
    await ensure_jetstream(nc.jetstream())
    yield Client(nc)
    # Bounded: on a loaded machine nats-py's close once waited for ever on its
    # socket (a whole CI run hung in this teardown); the server goes next anyway.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(nc.close(), 10)


job_pids = emulated_job_pids


async def announce(client: Client, job: str, config: dict[str, int]) -> None:
    """Publish a plan putting ``job`` on ``config``'s servers, as the scheduler
    does before any start: the monitor relays an executor's reports only for
    jobs placed (or planned) on its server. No placer runs to act on it."""
    plan = Plan(assignments=(Assignment(JobId(job), Configuration.of(config)),))
    msg = ev.PlanIssued(round=0, term=0, plan=plan, at=time.time())
    await client.js.publish(subjects.PLANS, ev.encode(msg))


def start_cmd(
    key: str,
    job_spec: JobSpec,
    server: str,
    config: dict[str, int],
    indices: tuple[int, ...],
    mode: Literal["run", "profile"] = "run",
    samples: float = 0.0,
) -> ev.StartJob:
    return ev.StartJob(
        key=key,
        job_id=job_spec.id,
        server_id=ServerId(server),
        spec=job_spec,
        configuration=Configuration.of(config),
        gpu_indices=indices,
        samples_done=samples,
        mode=mode,
    )


# --- tests ------------------------------------------------------------------------------


async def test_commands_are_idempotent_and_never_double_book(procs: Procs, client: Client) -> None:
    procs.monitor()
    procs.executor(S0)
    await client.wait_node(S0)
    beats = await client.collect(subjects.node_heartbeat(S0), ev.decode_node_heartbeat)
    long = spec("long")
    start = start_cmd("k-start", long, S0, {S0: 2}, (0, 1))
    first = await client.command(S0, start)
    assert first.ok, first
    assert await client.command(S0, start) == first  # the same key: acknowledged, not rerun
    await eventually(lambda: bool(beats) and beats[-1].running == ("long",), what="beat")
    assert len(job_pids("long")) == 1

    again = await client.command(S0, start_cmd("k-other", long, S0, {S0: 1}, (3,)))
    assert (again.ok, again.code) == (False, "conflict")
    # the same start under another key (a new placer's): acknowledged, naming
    # the start that runs it, and not run again
    same = await client.command(S0, start_cmd("k-same", long, S0, {S0: 2}, (0, 1)))
    assert (same.ok, same.code, same.started_by) == (True, "already_started", "k-start")
    assert len(job_pids("long")) == 1
    taken = await client.command(S0, start_cmd("k-taken", spec("b"), S0, {S0: 2}, (1, 2)))
    assert (taken.ok, taken.code) == (False, "conflict") and "[1]" in taken.error
    verdicts = await client.collect(f"hops.v1.reports.{S0}.*", ev.decode_report)
    unknown = await client.command(
        S0, start_cmd("k-model", spec("c", model="no-such-net"), S0, {S0: 1}, (2,))
    )
    assert (unknown.ok, unknown.code) == (False, "invalid") and "no-such-net" in unknown.error
    # no server can run it: the job fails rather than wait for ever; only that job
    await eventually(lambda: bool(verdicts), what="job_failed")
    assert len(verdicts) == 1 and isinstance(verdicts[0], ev.JobFailed)
    assert verdicts[0].job_id == "c"
    beyond = await client.command(S0, start_cmd("k-gpu", spec("d"), S0, {S0: 1}, (7,)))
    assert (beyond.ok, beyond.code) == (False, "invalid")
    missing = await client.command(S0, ev.StopJob(key="k-missing", job_id=JobId("nope")))
    assert (missing.ok, missing.code) == (False, "not_found")

    stop = ev.StopJob(key="k-stop", job_id=JobId("long"), reason="test")
    stopped = await client.command(S0, stop)
    assert stopped.ok and stopped.samples_done > 0
    assert await client.command(S0, stop) == stopped
    await eventually(lambda: not job_pids("long"), what="job process gone")
    await eventually(lambda: beats[-1].running == (), what="empty beat")
    free = await client.command(S0, start_cmd("k-free", spec("b"), S0, {S0: 2}, (1, 2)))
    assert free.ok  # GPUs 0 and 1 were given back


async def test_concurrent_commands_are_answered_once_and_never_double_book(
    procs: Procs, client: Client
) -> None:
    procs.monitor()
    procs.executor(S0)
    await client.wait_node(S0)
    same = start_cmd("k-same", spec("same"), S0, {S0: 1}, (0,))
    rivals = [start_cmd(f"k-{j}", spec(j), S0, {S0: 2}, (1, 2)) for j in ("r1", "r2", "r3")]
    acks = await asyncio.gather(*(client.command(S0, c) for c in (same, same, *rivals)))
    assert acks[0] == acks[1] and acks[0].ok  # one key in flight twice: one answer
    assert len(job_pids("same")) == 1
    winners = [c.job_id for c, a in zip(rivals, acks[2:], strict=True) if a.ok]
    assert len(winners) == 1  # GPUs 1 and 2 went to exactly one of the rivals
    assert all(a.code == "conflict" for a in acks[2:] if not a.ok)
    stops = [ev.StopJob(key=f"s-{j}", job_id=JobId(j)) for j in ("same", winners[0])]
    assert all(a.ok for a in await asyncio.gather(*(client.command(S0, c) for c in stops)))
    await eventually(lambda: not job_pids("same") and not job_pids(winners[0]), what="stopped")


async def test_an_emulated_job_runs_at_the_ground_truth_rate(procs: Procs, client: Client) -> None:
    scale, wall = 40.0, 3.0
    truth = GroundTruth(builtin_cluster(CLUSTER), builtin_catalog())
    config = Configuration.of({S0: 2})
    rate = truth.throughput(MODEL, config)
    job = spec("timed", total=rate * scale * wall)
    procs.monitor()
    procs.executor(S0, time_scale=scale)
    await client.wait_node(S0)
    # What the executor publishes: on its own server's subjects (the monitor
    # relays reports only for placed jobs, and none is placed here).
    reports = await client.collect(subjects.reports(S0, "timed"), ev.decode_report)
    beats = await client.collect(subjects.job_heartbeat(S0, "timed"), ev.decode_job_heartbeat)
    ack = await client.command(S0, start_cmd("k1", job, S0, {S0: 2}, (0, 1)))
    began = time.monotonic()
    assert ack.ok
    await eventually(
        lambda: any(isinstance(e, ev.JobFinished) for e in reports), 20, "job_finished"
    )
    took = time.monotonic() - began
    assert wall - 0.5 < took < wall + 2.0, took
    assert beats and all(b.server_id == S0 for b in beats)
    assert [b.samples_done for b in beats] == sorted(b.samples_done for b in beats)
    reported = [s.sample for s in reports if isinstance(s, ev.SampleReported)]
    assert reported and all(s.server_id == S0 and s.local_gpus == 2 for s in reported)
    per_gpu = rate / 2
    assert all(0.7 * per_gpu < s.per_gpu_throughput < 1.3 * per_gpu for s in reported)
    assert sum(isinstance(e, ev.JobFinished) for e in reports) == 1
    stream = await client.js.stream_info("HOPS_REPORTS")
    assert stream.state.messages == len(reports)  # each report went to the stream, once


async def test_profiling_runs_report_a_profile(procs: Procs, client: Client) -> None:
    procs.monitor()
    procs.executor(S1, time_scale=200.0)
    await client.wait_node(S1)
    reports = await client.collect(subjects.reports(S1, "prof"), ev.decode_report)
    ack = await client.command(S1, start_cmd("kp", spec("prof"), S1, {S1: 1}, (3,), "profile"))
    assert ack.ok
    await eventually(lambda: bool(reports), 15, "profile_reported")
    report = reports[0]
    assert isinstance(report, ev.ProfileReported)
    assert (report.report.server_id, report.report.gpu_type) == (S1, "RTX3090")
    assert len(report.report.modules.t_d) == 20
    await eventually(lambda: not job_pids("prof"), what="profiling process gone")


async def test_a_killed_job_process_is_a_failed_job(procs: Procs, client: Client) -> None:
    procs.monitor()
    procs.executor(S0)
    await client.wait_node(S0)
    events = await client.collect(subjects.reports(S0, "victim"), ev.decode_report)
    assert (await client.command(S0, start_cmd("kv", spec("victim"), S0, {S0: 1}, (0,)))).ok
    (pid,) = job_pids("victim")
    os.kill(pid, signal.SIGKILL)
    await eventually(lambda: bool(events), 10, "job_failed")
    assert isinstance(events[0], ev.JobFailed) and "-9" in events[0].reason
    # the executor forgot it: its GPU can be booked again
    assert (await client.command(S0, start_cmd("kw", spec("next"), S0, {S0: 1}, (0,)))).ok


async def test_a_worker_beats_reports_its_own_samples_and_ends_with_its_executor(
    procs: Procs, client: Client
) -> None:
    procs.monitor()
    executor = procs.executor(S1)
    await client.wait_node(S1)
    beats = await client.collect(subjects.job_heartbeat(S1, "dist"), ev.decode_job_heartbeat)
    reports = await client.collect(subjects.reports(S1, "dist"), ev.decode_report)
    cmd = start_cmd("kd", spec("dist"), S1, {S0: 1, S1: 1}, (0,), samples=500.0)
    assert (await client.command(S1, cmd)).ok
    await eventually(lambda: len(beats) >= 2 and bool(reports), 10, "worker beats and samples")
    assert {(b.server_id, b.samples_done) for b in beats} == {(S1, 500.0)}
    # S1's identity may publish only S1's reports: the worker reports its own part.
    assert all(isinstance(r, ev.SampleReported) and r.sample.server_id == S1 for r in reports)
    (pid,) = job_pids("dist")
    executor.send_signal(signal.SIGKILL)  # the node dies: its job processes follow
    await eventually(lambda: exited(pid), 10, "orphan exit")


async def test_the_supervisor_runs_one_executor_per_server(
    procs: Procs, client: Client, tmp_path: Path
) -> None:
    cluster = tmp_path / "two.yaml"
    cluster.write_text(
        "name: two\n"
        "gpu_types:\n  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}\n"
        "servers:\n  - {id_prefix: n-, count: 2, gpu_type: RTX3090, gpus: 2}\n"
    )
    procs.monitor()
    supervisor = procs.start("supervisor", "executor", "--cluster", str(cluster), "--all")
    await client.wait_node("n-0")
    await client.wait_node("n-1")
    second = await client.kv_get(subjects.KV_NODES, "n-1", NodeRecord)
    assert second is not None and second.order == 1 and second.server.gpus == 2
    supervisor.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(supervisor.wait, 15) == 0
    log = procs.log("supervisor")
    assert log.count('"executor stopped"') == 2
