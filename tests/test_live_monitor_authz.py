"""The monitor holds what executors send to the server their subject names,
against a real nats-server: the test plays the executors of ``n0`` and
``n1`` (NATS permissions let each executor's identity publish only its own
server's subjects; here the test publishes them itself) and the placer (it
writes ``hops_alloc``). Every forgery is refused, changes nothing, and is
audited: an error record with code ``forbidden`` and
``hops_refused_total{service="monitor",code="forbidden"}``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from services.runtime.bus import publish_event
from shared import events as ev
from shared import subjects
from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ThroughputSample
from shared.records import NodeRecord
from tests.helpers import free_port
from tests.test_live_executor import (
    HEARTBEAT_S,
    TIMEOUT_S,
    Client,
    Procs,
    client,
    eventually,
    nats_server,
    nats_url,
    procs,
)
from tests.test_live_monitor import ask_register, first_register, gone, place, register, scrape

__all__ = ["client", "nats_server", "nats_url", "procs"]  # fixtures

REFUSED = "hops_refused_total[code=forbidden][service=monitor]"
N0, N1 = ServerId("n0"), ServerId("n1")


async def two_nodes(procs: Procs, client: Client, **env: str) -> tuple[int, list[ev.ErrorRecord]]:
    """A monitor (metrics on the returned port) with nodes n0 and n1
    registered, and the error records from then on."""
    port = free_port()
    procs.monitor(HOPS_METRICS_PORT=str(port), HOPS_REPORT_WAIT_S="1", **env)
    errors = await client.collect(subjects.ERRORS, ev.decode_error_record)
    assert (await first_register(client, register("n0"))).ok
    assert (await ask_register(client, register("n1"))).ok
    return port, errors


def refused(port: int) -> float:
    try:
        return scrape(port).get(REFUSED, 0.0)
    except OSError:
        return 0.0


def forbidden(errors: list[ev.ErrorRecord]) -> list[ev.ErrorRecord]:
    return [e for e in errors if e.code == "forbidden"]


async def beat(
    client: Client, subject_sid: str, payload_sid: str = "", **lists: tuple[str, ...]
) -> None:
    hb = ev.NodeHeartbeat(server_id=ServerId(payload_sid or subject_sid), at=time.time(),
                          running=tuple(JobId(j) for j in lists.get("running", ())),
                          lost=tuple(JobId(j) for j in lists.get("lost", ())))
    await client.nc.publish(subjects.node_heartbeat(subject_sid), ev.encode(hb))


@contextlib.asynccontextmanager
async def honest(client: Client, job: str) -> AsyncIterator[None]:
    """n0 and n1 beat honestly meanwhile, n1 running ``job`` (so no deadline
    releases anything the forgeries did not)."""

    async def loop() -> None:
        while True:
            await beat(client, "n0")
            await beat(client, "n1", running=(job,))
            hb = ev.JobHeartbeat(job_id=JobId(job), server_id=N1, samples_done=1.0,
                                 at=time.time())
            await client.nc.publish(subjects.job_heartbeat("n1", job), ev.encode(hb))
            await asyncio.sleep(HEARTBEAT_S / 2)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_registration_under_another_servers_id_is_refused(
    procs: Procs, client: Client
) -> None:
    port, errors = await two_nodes(procs, client)
    before = await client.kv_get(subjects.KV_NODES, "n1", NodeRecord)
    # n0's executor claims n1 (with other GPUs), then a server never seen.
    for claimed in (register("n1", gpus=8), register("n9")):
        reply = await ask_register(client, claimed, server="n0")
        assert (reply.ok, reply.code) == (False, "forbidden"), reply
        assert "server n0 may not register server" in reply.error
    assert await client.kv_get(subjects.KV_NODES, "n1", NodeRecord) == before
    assert await client.kv_get(subjects.KV_NODES, "n9", NodeRecord) is None
    await eventually(lambda: len(forbidden(errors)) == 2, what="two audits")
    assert {e.subject for e in forbidden(errors)} == {"hops.v1.nodes.register.n0"}
    assert all(e.service == "monitor" for e in forbidden(errors))
    await eventually(lambda: refused(port) == 2, 10, "hops_refused_total")


async def test_a_heartbeat_from_the_wrong_server_changes_nothing(
    procs: Procs, client: Client
) -> None:
    port, errors = await two_nodes(procs, client)
    released = await client.collect(subjects.RELEASED, ev.decode_plan_event)
    await place(client, "j1", {"n1": 1}, {"n1": (0,)})
    async with honest(client, "j1"):
        await forge_heartbeats(client, errors)
        assert await client.placement("j1") is not None and not released
    await eventually(lambda: refused(port) == 3, 10, "hops_refused_total")


async def forge_heartbeats(client: Client, errors: list[ev.ErrorRecord]) -> None:
    # n0 sends a heartbeat in n1's name saying j1 was lost (it would requeue it) ...
    await beat(client, "n0", "n1", lost=("j1",))
    # ... and one as itself listing n1's job as lost and running, and a job heartbeat
    # in n1's name.
    await beat(client, "n0", lost=("j1",), running=("j1",))
    hb = ev.JobHeartbeat(job_id=JobId("j1"), server_id=N1, samples_done=1e9, at=time.time())
    await client.nc.publish(subjects.job_heartbeat("n0", "j1"), ev.encode(hb))
    await eventually(lambda: len(forbidden(errors)) == 2, what="refused at once")
    reasons = sorted(e.error for e in forbidden(errors))
    assert "server n0 may not send the heartbeat of server n1" in reasons
    assert "job_heartbeat of server n1 on the subject of server n0" in reasons
    # The entries of a job not placed on n0 are ignored, then audited after a grace.
    await eventually(lambda: len(forbidden(errors)) == 3, 4 * TIMEOUT_S, "entries audited")
    assert "j1, which is not placed on server n0" in forbidden(errors)[-1].error


def sample_of(job: str, server: str) -> ev.SampleReported:
    return ev.SampleReported(at=time.time(), sample=ThroughputSample(
        job_id=JobId(job), server_id=ServerId(server), gpu_type=GpuType("RTX3090"),
        local_gpus=1, nodes=1, total_gpus=1, per_gpu_throughput=100.0))


async def test_a_report_for_a_job_not_placed_there_is_not_relayed(
    procs: Procs, client: Client
) -> None:
    port, errors = await two_nodes(procs, client)
    events = await client.collect(subjects.JOB_EVENTS_ALL, ev.decode_job_event)
    samples = await client.collect(subjects.SAMPLES_ALL, ev.decode_sample_event)
    await place(client, "j1", {"n1": 1}, {"n1": (0,)})
    async with honest(client, "j1"):
        await forge_reports(client, errors)
        assert not events and not samples
        assert await client.placement("j1") is not None
    await eventually(lambda: refused(port) == 3, 10, "hops_refused_total")
    # Refused for good: nothing left to redeliver on HOPS_REPORTS.
    info = await client.js.consumer_info("HOPS_REPORTS", "monitor-reports")
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def forge_reports(client: Client, errors: list[ev.ErrorRecord]) -> None:
    # n0 claims n1's job finished, and reports samples of it (of itself and of n1).
    finished = ev.JobFinished(job_id=JobId("j1"), at=time.time())
    await publish_event(client.js, subjects.reports("n0", "j1"), finished, msg_id="j1:job_finished")
    for server in ("n0", "n1"):
        await client.nc.publish(subjects.reports("n0", "j1"), ev.encode(sample_of("j1", server)))
    await eventually(lambda: len(forbidden(errors)) == 3, 10, "three refusals")
    reasons = sorted(e.error for e in forbidden(errors))
    assert reasons.count("job j1 is not placed on server n0") == 2
    assert "sample_reported of server n1 on the subject of server n0" in reasons
    await asyncio.sleep(1.0)


async def test_a_legit_report_is_relayed_exactly_once(procs: Procs, client: Client) -> None:
    port, errors = await two_nodes(procs, client)
    events = await client.collect(subjects.job_events("j1"), ev.decode_job_event)
    samples = await client.collect(subjects.samples("j1"), ev.decode_sample_event)
    await place(client, "j1", {"n1": 1}, {"n1": (0,)})
    async with honest(client, "j1"):
        await report_twice(client, events, samples)
    assert not forbidden(errors) and refused(port) == 0


async def report_twice(client: Client, events: list[ev.JobEvent],
                       samples: list[ev.SampleEvent]) -> None:
    sample = sample_of("j1", "n1")
    await client.nc.publish(subjects.reports("n1", "j1"), ev.encode(sample))
    finished = ev.JobFinished(job_id=JobId("j1"), at=time.time())
    for _ in range(2):  # a retried publish: the same message id
        await publish_event(client.js, subjects.reports("n1", "j1"), finished,
                            msg_id="j1:job_finished")
    await gone(client, "j1", 10.0)  # the relayed job_finished released it
    await eventually(lambda: bool(events) and bool(samples), what="relayed")
    await asyncio.sleep(1.0)
    assert events == [finished] and samples == [sample]
    stored = await client.js.get_last_msg("HOPS_JOBS", subjects.job_events("j1"))
    assert stored.headers is not None and stored.headers["Nats-Msg-Id"] == "j1:job_finished"
    jobs = await client.js.stream_info("HOPS_JOBS")
    assert jobs.state.messages == 1
    # A report published again after the relay (a retry) is still stored once.
    await publish_event(client.js, subjects.reports("n1", "j1"), finished,
                        msg_id="j1:job_finished")
    await asyncio.sleep(1.0)
    assert (await client.js.stream_info("HOPS_JOBS")).state.messages == 1
