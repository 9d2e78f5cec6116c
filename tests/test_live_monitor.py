"""The monitor against a real nats-server, with real EMULATED executors:
registration, heartbeat deadlines of jobs and nodes, releases on a job's
end, cancel and profiling, and the metrics endpoint.

The tests play the scheduler and the placer themselves: they write
``hops_jobs`` and ``hops_alloc`` and send commands the way those services do."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from typing import Literal

import nats.errors
import pytest
from nats.aio.msg import Msg
from prometheus_client.parser import text_string_to_metric_families

from services.runtime.natsd import EmbeddedNats
from shared import events as ev
from shared import subjects
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.records import NodeRecord, Placement
from tests.helpers import free_port
from tests.test_live_executor import (
    CLUSTER,
    HEARTBEAT_S,
    MODEL,
    S0,
    S1,
    TIMEOUT_S,
    Client,
    Procs,
    client,
    eventually,
    job_pids,
    nats_server,
    nats_url,
    procs,
    spec,
    start_cmd,
)
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

__all__ = ["client", "nats_server", "nats_url", "procs"]  # fixtures

RTX = GpuTypeSpec(GpuType("RTX3090"), 2.5e9, 1e9)


def register(
    server: str, gpus: int = 4, gpu_type: GpuTypeSpec = RTX, order: int = 0
) -> ev.RegisterNode:
    return ev.RegisterNode(
        server=Server(ServerId(server), GpuType("RTX3090"), gpus), gpu_type=gpu_type, order=order
    )


async def ask_register(
    client: Client, msg: ev.RegisterNode | bytes, server: str | None = None
) -> ev.Reply:
    """Register on ``server``'s subject (by default the server ``msg`` names)."""
    data = msg if isinstance(msg, bytes) else ev.encode(msg)
    sid = server or (msg.server.id if isinstance(msg, ev.RegisterNode) else "")
    reply = await client.nc.request(subjects.nodes_register(sid), data, timeout=10)
    return ev.decode_reply(reply.data)


async def place(
    client: Client,
    job: str,
    config: dict[str, int],
    indices: dict[str, tuple[int, ...]],
    mode: Literal["run", "profile"] = "run",
) -> None:
    """Write the ``hops_alloc`` entry as the placer does after the acks."""
    p = Placement(
        job_id=JobId(job),
        configuration=Configuration.of(config),
        gpu_indices={ServerId(s): i for s, i in indices.items()},
        mode=mode,
        key=f"test:{job}",
    )
    await client.kv_put(subjects.KV_ALLOC, job, p)


def decode_released(data: bytes) -> ev.ResourcesReleased:
    msg = ev.decode_plan_event(data)
    assert isinstance(msg, ev.ResourcesReleased)
    return msg


async def gone(client: Client, job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await client.placement(job) is not None:
        assert time.monotonic() < deadline, f"placement of {job} never released"
        await asyncio.sleep(0.05)


async def first_register(client: Client, msg: ev.RegisterNode) -> ev.Reply:
    """Register once the monitor serves (as an executor does)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return await ask_register(client, msg)
        except nats.errors.NoRespondersError:
            assert time.monotonic() < deadline, "the monitor never answered"
            await asyncio.sleep(0.1)


async def test_registration_is_validated(procs: Procs, client: Client) -> None:
    procs.monitor()
    errors = await client.collect(subjects.ERRORS, ev.decode_error_record)
    ok = await first_register(client, register("n0", order=3))
    assert ok == ev.Reply(ok=True, server_id="n0")
    rec = await client.kv_get(subjects.KV_NODES, "n0", NodeRecord)
    assert rec is not None and rec.alive and rec.order == 3 and rec.server.gpus == 4
    # a server whose gpu_type names another type than the spec describes
    bad = json.loads(ev.encode(register("n1")))
    bad["server"]["gpu_type"] = "TitanXP"
    mismatch = await ask_register(client, json.dumps(bad).encode(), "n1")
    assert (mismatch.ok, mismatch.code) == (False, "invalid") and "TitanXP" in mismatch.error
    twice = await ask_register(client, register("n0", gpus=8, order=3))
    assert (twice.ok, twice.code) == (False, "conflict") and "gpus" in twice.error
    other_bw = GpuTypeSpec(GpuType("RTX3090"), 9e9, 1e9)
    clash = await ask_register(client, register("n2", gpu_type=other_bw))
    assert (clash.ok, clash.code) == (False, "conflict")
    assert await ask_register(client, register("n0", order=3)) == ok  # a restart: same spec
    await eventually(lambda: len(errors) >= 3, what="error records")
    assert {e.code for e in errors} == {"invalid", "conflict"}
    assert await client.kv_get(subjects.KV_NODES, "n1", NodeRecord) is None
    # heartbeats of a server that never registered
    beat = ev.NodeHeartbeat(server_id=ServerId("ghost"), at=time.time())
    await client.nc.publish(subjects.node_heartbeat("ghost"), ev.encode(beat))
    await eventually(lambda: any(e.code == "not_found" for e in errors), what="ghost")


async def stand_in_executor(client: Client, server: str) -> None:
    """Answer every command to ``server`` with a success, as an executor that
    stopped the job's (hung) process would."""

    async def on_command(msg: Msg) -> None:
        cmd = ev.decode_command(msg.data)
        await msg.respond(ev.encode(ev.CommandAck(key=cmd.key, ok=True, samples_done=42.0)))

    await client.nc.subscribe(subjects.exec_commands(server), cb=on_command)
    await client.nc.flush()


async def test_silent_jobs_hung_or_ended(procs: Procs, client: Client) -> None:
    """The deadline path alone (the test beats for a node and two jobs): a
    job its node still lists hangs and fails at its deadline (the stop found
    its process); a job its node no longer lists ended, and without an event
    saying how it vanishes."""
    vanish = 4.0
    procs.monitor(HOPS_VANISH_GRACE_S=str(vanish))
    assert (await first_register(client, register("n0"))).ok
    await stand_in_executor(client, "n0")
    events = await client.collect(subjects.JOB_EVENTS_ALL, ev.decode_job_event)
    released = await client.collect(subjects.RELEASED, decode_released)
    await place(client, "hung", {"n0": 2}, {"n0": (0, 1)})
    await place(client, "ended", {"n0": 1}, {"n0": (2,)})
    silent = time.monotonic() + 1.0  # beat a while, then fall silent
    gone_at: dict[str, float] = {}
    while len(gone_at) < 2:
        now = time.monotonic()
        running = ("hung",) if now >= silent else ("hung", "ended")
        beat = ev.NodeHeartbeat(server_id=ServerId("n0"), at=time.time(), running=running)
        await client.nc.publish(subjects.node_heartbeat("n0"), ev.encode(beat))
        for job in ("hung", "ended"):
            if now < silent:
                hb = ev.JobHeartbeat(job_id=JobId(job), server_id=ServerId("n0"),
                                     samples_done=42.0, at=time.time())
                await client.nc.publish(subjects.job_heartbeat("n0", job), ev.encode(hb))
            elif job not in gone_at and await client.placement(job) is None:
                gone_at[job] = now - silent
        assert now - silent < vanish + 3.0, f"not released in time: {gone_at}"
        await asyncio.sleep(HEARTBEAT_S / 2)
    assert TIMEOUT_S - 0.5 < gone_at["hung"] < TIMEOUT_S + 2.0
    assert vanish - 0.5 < gone_at["ended"] < vanish + 2.0
    await eventually(lambda: len(events) == 2 and len(released) == 2, what="events")
    verdicts = {e.job_id: (type(e).__name__, getattr(e, "reason", "")) for e in events}
    assert verdicts == {"hung": ("JobFailed", "heartbeat lost"),
                        "ended": ("JobStopped", "process vanished")}
    stopped = next(e for e in events if isinstance(e, ev.JobStopped))
    assert stopped.samples_done == 42.0
    assert {r.job_id: r.server_ids for r in released} == {"hung": ("n0",), "ended": ("n0",)}
    record = await client.kv_get(subjects.KV_NODES, "n0", NodeRecord)
    assert record is not None and record.alive


async def test_a_killed_job_process_releases_its_gpus(procs: Procs, client: Client) -> None:
    procs.monitor()
    procs.executor(S0)
    await client.wait_node(S0)
    released = await client.collect(subjects.RELEASED, decode_released)
    assert (await client.command(S0, start_cmd("k", spec("kill"), S0, {S0: 2}, (1, 2)))).ok
    await place(client, "kill", {S0: 2}, {S0: (1, 2)})
    await asyncio.sleep(HEARTBEAT_S * 2)  # the monitor watches it
    (pid,) = job_pids("kill")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    await gone(client, "kill", TIMEOUT_S + 2.0)
    await eventually(lambda: bool(released), what="resources_released")
    assert time.monotonic() - killed < TIMEOUT_S + 2.0
    assert released[0].job_id == "kill"


async def test_a_lost_node_requeues_its_jobs(procs: Procs, client: Client) -> None:
    procs.monitor()
    doomed = procs.executor(S0)
    procs.executor(S1)
    await client.wait_node(S0)
    await client.wait_node(S1)
    events = await client.collect(subjects.JOB_EVENTS_ALL, ev.decode_job_event)
    released = await client.collect(subjects.RELEASED, decode_released)
    both = spec("both")
    for server, idx in ((S0, (0,)), (S1, (0,))):
        cmd = start_cmd(f"k-{server}", both, server, {S0: 1, S1: 1}, idx)
        assert (await client.command(server, cmd)).ok
    assert (await client.command(S1, start_cmd("k-solo", spec("solo"), S1, {S1: 2}, (1, 2)))).ok
    await place(client, "both", {S0: 1, S1: 1}, {S0: (0,), S1: (0,)})
    await place(client, "solo", {S1: 2}, {S1: (1, 2)})
    await asyncio.sleep(HEARTBEAT_S * 2)
    doomed.send_signal(signal.SIGKILL)
    await gone(client, "both", TIMEOUT_S + 4.0)
    await client.wait_node(S0, alive=False, timeout=5)
    await eventually(lambda: bool(events) and bool(released), what="events")
    stopped = [e for e in events if isinstance(e, ev.JobStopped)]
    assert [(e.job_id, e.reason) for e in stopped] == [("both", "node lost")]
    assert stopped[0].samples_done is not None and stopped[0].samples_done > 0
    assert released[0].server_ids == (S0, S1) and released[0].reason == "node lost"
    # its part on the surviving node was stopped; the other job there runs on
    await eventually(lambda: len(job_pids("both")) == 0, what="worker stopped")
    assert await client.placement("solo") is not None and len(job_pids("solo")) == 1
    assert not any(isinstance(e, ev.JobFailed) for e in events)


async def test_ends_release_at_once(procs: Procs, client: Client) -> None:
    scale = 50.0
    truth = GroundTruth(builtin_cluster(CLUSTER), builtin_catalog())
    rate = truth.throughput(MODEL, Configuration.of({S0: 1}))
    procs.monitor()
    procs.executor(S0, time_scale=scale)
    await client.wait_node(S0)
    released = await client.collect(subjects.RELEASED, decode_released)
    short = spec("short", total=rate * scale * 1.5)
    assert (await client.command(S0, start_cmd("k1", short, S0, {S0: 1}, (0,)))).ok
    await place(client, "short", {S0: 1}, {S0: (0,)})
    # a job cancelled while it runs: its process is stopped too
    assert (await client.command(S0, start_cmd("k2", spec("cancel"), S0, {S0: 1}, (1,)))).ok
    await place(client, "cancel", {S0: 1}, {S0: (1,)})
    await client.js.publish(
        subjects.job_events("cancel"),
        ev.encode(ev.JobCancelled(job_id=JobId("cancel"), at=time.time())),
    )
    await gone(client, "cancel", 5.0)
    await eventually(lambda: not job_pids("cancel"), what="cancelled job stopped")
    # a profiling run that reported frees its GPU
    assert (
        await client.command(S0, start_cmd("k3", spec("prof"), S0, {S0: 1}, (2,), "profile"))
    ).ok
    await place(client, "prof", {S0: 1}, {S0: (2,)}, mode="profile")
    await gone(client, "short", 10.0)  # finished by itself
    await gone(client, "prof", 10.0)
    await eventually(lambda: len(released) == 3, what="three releases")
    reasons = {r.job_id: r.reason for r in released}
    assert reasons == {"cancel": "cancelled", "short": "finished", "prof": "profiled"}


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f"[{k}={v}]" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


async def test_metrics_endpoint(procs: Procs, client: Client) -> None:
    port = free_port()
    procs.monitor(HOPS_METRICS_PORT=str(port))
    procs.executor(S0)
    await client.wait_node(S0)
    await client.put_job(spec("waiting"), phase="queued")
    await client.put_job(spec("busy"), phase="running")
    await place(client, "busy", {S0: 1}, {S0: (0,)})
    await client.nc.publish(
        subjects.ERRORS,
        ev.encode(ev.ErrorRecord(service="gateway", subject="x", error="bad", at=1.0)),
    )

    def metrics_ready() -> bool:
        try:
            m = scrape(port)
        except OSError:
            return False
        return (
            m.get("hops_gpus_used") == 1
            and m.get("hops_queue_length") == 1
            and m.get("hops_errors_total[service=gateway]") == 1
        )

    await eventually(metrics_ready, 15, "metrics")
    m = scrape(port)
    assert m["hops_gpus_alive"] == 4 and m["hops_gpu_utilisation"] == pytest.approx(0.25)
    assert m["hops_fragmented_gpus"] == 3  # idle while a job waits
    assert m["hops_jobs[phase=running]"] == 1 and m["hops_running_jobs"] == 1
    assert m["hops_nodes[state=alive]"] == 1 and m["hops_raqlr"] == 0


async def test_a_nats_restart_loses_nothing(
    procs: Procs, client: Client, nats_server: EmbeddedNats
) -> None:
    """An outage longer than the heartbeat deadline: the monitor judges
    nobody while it cannot hear, and follows the buckets again afterwards."""
    port = free_port()
    procs.monitor(HOPS_METRICS_PORT=str(port), HOPS_HEARTBEAT_TIMEOUT_S="3")
    procs.executor(S0)
    await client.wait_node(S0)
    events = await client.collect(subjects.JOB_EVENTS_ALL, ev.decode_job_event)
    assert (await client.command(S0, start_cmd("k1", spec("before"), S0, {S0: 1}, (0,)))).ok
    await place(client, "before", {S0: 1}, {S0: (0,)})

    def used(n: int) -> Callable[[], bool]:
        def check() -> bool:
            try:
                return scrape(port).get("hops_gpus_used") == n
            except OSError:
                return False

        return check

    await eventually(used(1), 15, "the first placement seen")
    await asyncio.to_thread(nats_server.stop)
    await asyncio.sleep(3.5)  # longer than the deadline: nobody is heard meanwhile
    await asyncio.to_thread(nats_server.start)
    await eventually(lambda: client.nc.is_connected, 15, "reconnected")
    deadline = time.monotonic() + 15
    while True:  # until the executor is back on the bus too
        try:
            ack = await client.command(S0, start_cmd("k2", spec("after"), S0, {S0: 2}, (1, 2)))
            break
        except nats.errors.NoRespondersError:
            assert time.monotonic() < deadline, "the executor never came back"
            await asyncio.sleep(0.1)
    assert ack.ok
    await place(client, "after", {S0: 2}, {S0: (1, 2)})
    await eventually(used(3), 15, "a placement written after the restart seen")
    await asyncio.sleep(3.5)  # past a heartbeat deadline
    assert used(3)() and not events
    node = await client.kv_get(subjects.KV_NODES, S0, NodeRecord)
    assert node is not None and node.alive
