"""The scheduler service as real processes against a real nats-server:
admission, leader failover, and plans from profiling to an assignment.

The helpers here (:class:`Stack`, :class:`Bus`) are shared with the
estimator's and profiler's tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError

from scheduling.live.state import LiveJobRecord, decode_record
from services.runtime.bus import JetStreamLayout, connect, ensure_jetstream, publish_event
from services.runtime.settings import RuntimeSettings
from shared import events as ev
from shared import subjects
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample, TimeModules
from shared.records import NodeRecord, QueueView
from tests.natsfix import nats_server, nats_url

__all__ = ["nats_server", "nats_url"]  # fixtures

ROOT = Path(__file__).resolve().parent.parent
TTL = 2.0  # the leader lease's TTL in these tests (the default is 10 s)
T = TypeVar("T")

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
B = GpuTypeSpec(GpuType("B"), 5e9, 1e9)
NODES = (("a0", A, 4), ("a1", A, 4), ("b0", B, 2))


async def eventually(
    probe: Callable[[], Awaitable[T | None]], timeout: float = 10.0, what: str = "condition"
) -> T:
    """The first truthy value ``probe`` returns, polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} never held within {timeout} s"
        await asyncio.sleep(0.05)


class Service:
    """One service as its own OS process (``python -m module``); its JSON
    log lines go to a file."""

    def __init__(self, module: str, env: dict[str, str], log: Path) -> None:
        self.module, self.env, self.log = module, env, log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> Service:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", self.module, env=self.env, stdout=out, stderr=out, cwd=ROOT
            )
        return self

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": line, "level": "raw"})
        return out

    def lines_with(self, event: str) -> list[dict[str, Any]]:
        return [x for x in self.lines() if x.get("event") == event]

    def find(self, event: str, **fields: object) -> dict[str, Any] | None:
        for line in self.lines():
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return line
        return None

    async def wait_log(self, event: str, timeout: float = 15.0, **fields: object) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            assert self.proc is not None and self.proc.returncode is None, self.tail()
            return self.find(event, **fields)

        return await eventually(probe, timeout, f"{self.module} logging {event!r}")

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()

    async def wait(self) -> int:
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self) -> int:
        """SIGTERM, then SIGKILL after 10 s; the exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
        return await self.proc.wait()

    def errors(self) -> list[dict[str, Any]]:
        return [x for x in self.lines() if x.get("level") in ("error", "critical")]


class Stack:
    """The services of one test, stopped (and checked for crashes) at the end."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.env = os.environ | {
            "HOPS_NATS_URL": url,
            "HOPS_LEADER_TTL": str(TTL),
            "HOPS_ROUND_S": "300",
            "HOPS_REPLAN_DELAY_S": "0.1",
            "HOPS_LOG_LEVEL": "info",
            "PYTHONPATH": str(ROOT),
        }
        self.tmp = tmp
        self.services: list[Service] = []

    async def start(self, module: str, **env: str) -> Service:
        log = self.tmp / f"{module}-{len(self.services)}.log"
        service = Service(module, self.env | env, log)
        self.services.append(service)
        return await service.start()

    async def close(self) -> None:
        for service in self.services:
            await service.stop()
        for service in self.services:
            assert not service.errors(), service.tail()


class Bus:
    """A test client: requests, KV reads and watches of what the services publish."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.plans: list[ev.PlanIssued] = []
        self.errors: list[ev.ErrorRecord] = []
        self.events: list[ev.JobEvent] = []

    async def start(self) -> Bus:
        await ensure_jetstream(self.js, JetStreamLayout(leader_ttl=TTL))

        async def on_plan(msg: Msg) -> None:
            event = ev.decode_plan_event(msg.data)
            if isinstance(event, ev.PlanIssued):
                self.plans.append(event)

        async def on_error(msg: Msg) -> None:
            self.errors.append(ev.decode_error_record(msg.data))

        async def on_event(msg: Msg) -> None:
            self.events.append(ev.decode_job_event(msg.data))

        for subject, cb in (
            (subjects.PLANS, on_plan),
            (subjects.ERRORS, on_error),
            (subjects.JOB_EVENTS_ALL, on_event),
        ):
            await self.nc.subscribe(subject, cb=cb)
        await asyncio.sleep(0)
        await self.nc.flush()
        return self

    async def ask(self, subject: str, msg: ev.Message | bytes, timeout: float = 5.0) -> ev.Reply:
        data = msg if isinstance(msg, bytes) else ev.encode(msg)
        return ev.decode_reply((await self.nc.request(subject, data, timeout=timeout)).data)

    async def submit(self, spec: JobSpec) -> ev.Reply:
        return await self.ask(subjects.JOBS_SUBMIT, ev.SubmitJob(spec=spec))

    async def cancel(self, job_id: str) -> ev.Reply:
        return await self.ask(subjects.JOBS_CANCEL, ev.CancelJob(job_id=JobId(job_id)))

    async def record(self, job_id: str) -> LiveJobRecord | None:
        kv = await self.js.key_value(subjects.KV_JOBS)
        try:
            return decode_record((await kv.get(job_id)).value or b"")
        except KeyNotFoundError:
            return None

    async def wait_phase(self, job_id: str, phase: str, timeout: float = 10.0) -> LiveJobRecord:
        async def probe() -> LiveJobRecord | None:
            rec = await self.record(job_id)
            return rec if rec is not None and rec.phase == phase else None

        return await eventually(probe, timeout, f"job {job_id} {phase}")

    async def put_nodes(self, nodes: tuple[tuple[str, GpuTypeSpec, int], ...] = NODES) -> None:
        kv = await self.js.key_value(subjects.KV_NODES)
        for order, (sid, gpu_type, gpus) in enumerate(nodes):
            server = Server(ServerId(sid), gpu_type.name, gpus)
            record = NodeRecord(server=server, gpu_type=gpu_type, order=order)
            await kv.put(sid, msgspec.json.encode(record))

    async def wait_plan(
        self, pred: Callable[[ev.PlanIssued], bool], timeout: float = 15.0
    ) -> ev.PlanIssued:
        async def probe() -> ev.PlanIssued | None:
            return next((p for p in self.plans if pred(p)), None)

        return await eventually(probe, timeout, "a matching plan")

    async def wait_error(self, code: str, timeout: float = 10.0) -> ev.ErrorRecord:
        async def probe() -> ev.ErrorRecord | None:
            return next((e for e in self.errors if e.code == code), None)

        return await eventually(probe, timeout, f"an error record {code}")

    async def profile(self, job_id: str, server: str, gpu_type: str) -> None:
        modules = TimeModules(t_f=0.05, t_b=0.1, t_u=0.01, t_d=(0.02, 0.021, 0.019, 0.02))
        report = ProfileReport(JobId(job_id), GpuType(gpu_type), ServerId(server), modules)
        await publish_event(
            self.js, subjects.profiles(job_id), ev.ProfileReported(report=report, at=time.time())
        )

    async def sample(self, job_id: str, server: str, gpu_type: str, tput: float) -> None:
        sample = ThroughputSample(
            JobId(job_id), ServerId(server), GpuType(gpu_type), per_gpu_throughput=tput
        )
        await publish_event(
            self.js, subjects.samples(job_id), ev.SampleReported(sample=sample, at=time.time())
        )


def job(job_id: str, reqs: tuple[int, ...] = (1, 2, 4)) -> JobSpec:
    return JobSpec(JobId(job_id), "resnet50", 32, 25_557_032, 1_000_000, requirements=reqs)


def profiled_in(plan: ev.PlanIssued, job_id: str) -> set[str]:
    return {t.gpu_type for t in plan.plan.profiling if t.job_id == job_id}


@pytest.fixture
async def stack(nats_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    s = Stack(nats_url, tmp_path)
    yield s
    await s.close()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    nc = await connect(RuntimeSettings(nats_servers=(nats_url,), reconnect_wait=0.1), "test")
    yield await Bus(nc).start()
    await nc.close()


# --- admission -------------------------------------------------------------------------


async def test_admission_records_publishes_and_refuses(stack: Stack, bus: Bus) -> None:
    scheduler = await stack.start("services.scheduler")
    await scheduler.wait_log("elected leader")
    before = time.time()
    assert await bus.submit(job("j1")) == ev.Reply(ok=True, job_id="j1")
    rec = await bus.record("j1")  # created before the reply
    assert rec is not None and rec.phase == "submitted" and rec.spec.submit_time >= before
    stored = await bus.js.get_last_msg("HOPS_JOBS", subjects.job_events("j1"))
    event = ev.decode_job_event(stored.data or b"")
    assert isinstance(event, ev.JobSubmitted) and event.spec == rec.spec

    # the very spec again (a client retrying after a 503): its acceptance
    assert await bus.submit(job("j1")) == ev.Reply(ok=True, job_id="j1")
    assert (await bus.js.stream_info("HOPS_JOBS")).state.messages == 1
    dup = await bus.submit(msgspec.structs.replace(job("j1"), batch_size=64))
    assert (dup.ok, dup.code) == (False, "conflict")  # another spec under a taken id
    assert bus.errors == []  # a deliberate refusal is no error record

    bad_id = await bus.submit(job("j@2"))
    assert (bad_id.ok, bad_id.code) == (False, "invalid") and "may only contain" in bad_id.error
    assert "may only contain" in (await bus.wait_error("invalid")).error
    bad_spec = msgspec.json.encode(msgspec.structs.asdict(job("j3")) | {"batch_size": 0})
    schema = await bus.ask(subjects.JOBS_SUBMIT, bad_spec)
    assert (schema.ok, schema.code) == (False, "invalid") and "batch_size" in schema.error
    await eventually(lambda: _async(len(bus.errors) == 2), what="two error records")
    assert await (await bus.js.key_value(subjects.KV_JOBS)).keys() == ["j1"]

    assert await queued(bus) == [("j1", "submitted")]  # nothing to plan on: no nodes
    unknown = await bus.cancel("nope")
    assert (unknown.ok, unknown.code) == (False, "not_found")
    assert (await bus.cancel("j1")).ok
    cancelled = await bus.wait_phase("j1", "cancelled")
    assert cancelled.finished_at is not None
    assert await queued(bus) == []  # the view follows the records at once
    again = await bus.cancel("j1")
    assert (again.ok, again.code) == (False, "conflict") and "cancelled already" in again.error
    assert (await bus.js.stream_info("HOPS_JOBS")).state.messages == 2  # submitted, cancelled


async def queued(bus: Bus) -> list[tuple[str, str]]:
    """The leader's queue view, (job, phase) in order, once the leader has one."""

    async def view() -> QueueView | None:
        reply = await bus.nc.request(subjects.QUEUE, b"{}", timeout=5)
        decoded = msgspec.json.decode(reply.data, type=QueueView)
        assert decoded.ok or decoded.error == "the leader is starting", decoded.error
        return decoded if decoded.ok else None

    return [(e.job_id, e.phase) for e in (await eventually(view, what="a queue view")).entries]


async def _async(value: T) -> T:
    return value


# --- failover ---------------------------------------------------------------------------


async def submit_retried(bus: Bus, spec: JobSpec, tries: int = 4) -> ev.Reply:
    """``spec`` submitted, asked again after each timeout (``tries`` in all)."""
    for _ in range(tries - 1):
        try:
            return await bus.submit(spec)
        except nats.errors.TimeoutError:
            continue
    return await bus.submit(spec)


async def test_a_standby_takes_over_when_the_leader_is_killed(stack: Stack, bus: Bus) -> None:
    await bus.put_nodes()
    first = await stack.start("services.scheduler", HOPS_REPLICA_ID="s1")
    await first.wait_log("elected leader")
    second = await stack.start("services.scheduler", HOPS_REPLICA_ID="s2")
    await second.wait_log("admission ready")
    old_term = first.find("elected leader")["term"]  # type: ignore[index]
    assert second.find("elected leader") is None

    assert (await bus.submit(job("before"))).ok
    await bus.wait_plan(lambda p: profiled_in(p, "before") == {"A", "B"})
    first.kill()  # SIGKILL: the lease is not released and must expire
    killed_at = time.monotonic()
    await first.wait()  # gone, so admission requests reach the standby
    # Asked while nobody leads; the standby admits it. A request the server
    # still routed to the dead replica's subscription is lost, and the
    # answer may come after the election (on a loaded machine the new
    # term's first load and plan share the process with admission): the
    # client asks again, as the gateway's callers do after its 503, and a
    # resubmission of the same spec is answered as accepted.
    during = asyncio.create_task(submit_retried(bus, job("during")))
    elected = await second.wait_log("elected leader", timeout=TTL + 5)
    took = time.monotonic() - killed_at
    assert elected["term"] > old_term and took < TTL + 3, took
    assert (await during).ok, second.tail()
    await second.wait_log("leader state loaded")
    # The new leader plans both jobs: profiling tasks under its own term.
    new = await bus.wait_plan(lambda p: p.term == elected["term"] and bool(p.plan.profiling))
    tasks = {
        (t.job_id, t.gpu_type) for p in bus.plans if p.term == new.term for t in p.plan.profiling
    }
    assert {("before", "A"), ("before", "B"), ("during", "A"), ("during", "B")} <= tasks
    assert (await bus.wait_phase("during", "profiling")).phase == "profiling"
    # Graceful stop hands the lease back at once.
    assert await second.stop() == 0
    kv = await bus.js.key_value(subjects.KV_LEADER)
    with pytest.raises(KeyNotFoundError):
        await kv.get("scheduler")


# --- from profiling to an assignment --------------------------------------------------------


async def test_plans_from_profiling_to_an_assignment(stack: Stack, bus: Bus) -> None:
    await stack.start("services.estimator")
    await stack.start("services.profiler")
    scheduler = await stack.start("services.scheduler")
    await scheduler.wait_log("elected leader")
    assert (await bus.submit(job("j1", (4,)))).ok
    await scheduler.wait_log("job event applied", job_id="j1", phase="submitted")
    assert bus.plans == []  # no nodes, nothing to plan on
    await bus.put_nodes()  # new capacity: a plan within the round
    plan = await bus.wait_plan(lambda p: profiled_in(p, "j1") == {"A", "B"})
    assert plan.plan.assignments == ()
    await bus.wait_phase("j1", "profiling")
    await profile_as_planned(bus, plan, "j1")
    await bus.sample("j1", "a0", "A", 190.0)
    assigned = await bus.wait_plan(lambda p: p.plan.config_of(JobId("j1")) is not None)
    config = assigned.plan.config_of(JobId("j1"))
    assert config is not None and config.total_gpus == 4 and assigned.term == plan.term
    rec = await bus.wait_phase("j1", "queued")
    assert rec.profiled == ("A", "B")

    reply = await bus.nc.request(subjects.QUEUE, b"", timeout=5)
    view = msgspec.json.decode(reply.data, type=QueueView)
    assert view.ok and view.term == plan.term and view.leader
    (entry,) = view.entries
    assert (entry.job_id, entry.phase, entry.in_window) == ("j1", "queued", True)

    # What the placer would publish next.
    await publish(bus, ev.JobStarted(job_id=JobId("j1"), configuration=config, at=time.time()))
    running = await bus.wait_phase("j1", "running")
    assert running.configuration == config and running.first_start is not None

    # j2 needs all eight A GPUs: it waits while j1 holds four of them ...
    assert (await bus.submit(job("j2", (8,)))).ok
    plan2 = await bus.wait_plan(lambda p: profiled_in(p, "j2") == {"A", "B"})
    await profile_as_planned(bus, plan2, "j2")
    await bus.wait_phase("j2", "queued")
    await scheduler.wait_log("job event applied", job_id="j2", phase="queued")
    await scheduler.wait_log("nothing to add")  # the plan j2's profiles called for
    # ... and gets them in a plan within the round once j1's are released.
    await publish(bus, ev.JobFinished(job_id=JobId("j1"), at=time.time()))
    finished = await bus.wait_phase("j1", "finished")
    assert finished.samples_done == 1_000_000 and sum(finished.attained_by_type.values()) > 0
    assert not any(p.plan.config_of(JobId("j2")) for p in bus.plans)
    released = ev.ResourcesReleased(job_id=JobId("j1"), server_ids=config.servers, at=time.time())
    await publish_event(bus.js, subjects.RELEASED, released)
    fill = await bus.wait_plan(lambda p: p.plan.config_of(JobId("j2")) is not None)
    assert not fill.first_plan and fill.plan.config_of(JobId("j2")) == Configuration.of(
        {"a0": 4, "a1": 4}
    )
    assert (await bus.cancel("j1")).code == "conflict"


async def publish(bus: Bus, event: ev.JobEvent) -> None:
    await publish_event(bus.js, subjects.job_events(event.job_id), event)


async def profile_as_planned(bus: Bus, plan: ev.PlanIssued, job_id: str) -> None:
    """What the executors would report after the plan's profiling runs."""
    for task in plan.plan.profiling:
        if task.job_id == job_id:
            await bus.profile(job_id, task.server, task.gpu_type)
