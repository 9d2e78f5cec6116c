"""What the gateway tells of why a job waits, on a real nats-server: the
test writes ``hops_jobs`` records, ``hops_explain`` entries and
``HOPS_TIMELINE`` messages as the scheduler leader writes them and reads
``GET /jobs/{id}`` (reason, receipt, forecast, conditions), ``GET
/jobs/{id}/timeline``, ``GET /jobs`` and ``GET /queue`` as an admin and as
tenants: another tenant's job is "another tenant's job" everywhere, its
id never leaves the gateway. The gateway also reads them under its own
NATS identity (nkey permissions, services.runtime.identity)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from fastapi import FastAPI
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.runtime.bus import connect, ensure_jetstream
from services.runtime.identity import ADMIN as ADMIN_IDENTITY
from services.runtime.identity import GATEWAY
from shared import subjects
from shared.explain import ANOTHER_TENANT, JobExplain, TimelineEntry
from shared.ids import JobId
from shared.job import JobSpec
from shared.records import JobRecord, QueueEntry, QueueView
from shared.tenants import load_tenants
from tests.natsfix import nats_server, nats_url, secured_nats
from tests.test_conditions import FORECAST, PRIORITY, RECEIPT
from tests.test_gateway import gateway_settings, nc, spec_json

__all__ = ["nats_server", "nats_url", "nc"]  # fixtures

TENANTS = load_tenants("""\
tenants:
  alice: {tokens: ["alice-token"]}
  bob: {tokens: ["bob-token"]}
admins:
  ops: {tokens: ["admin-token"]}
""")
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
ADMIN = {"Authorization": "Bearer admin-token"}

WHY = PRIORITY


def record(key: str, tenant: str, phase: str, **kw: Any) -> JobRecord:
    spec = msgspec.convert(spec_json(key, tenant=tenant), JobSpec)
    return JobRecord(spec=spec, submitted_at=10.0, phase=phase, **kw)  # type: ignore[arg-type]


RECORDS = [record("alice/j1", "alice", "queued", first_start=20.0, restarts=1,
                  profiled=("RTX3090",)),
           record("alice/a2", "alice", "running", first_start=25.0),
           record("bob/b1", "bob", "running", first_start=30.0)]
TIMELINE = [
    TimelineEntry(job_id=JobId("alice/j1"), at=10.0, kind="submitted"),
    TimelineEntry(job_id=JobId("alice/j1"), at=20.0, kind="started", note="on s0:2"),
    TimelineEntry(job_id=JobId("alice/j1"), at=30.0, kind="stopped", receipt=RECEIPT),
    TimelineEntry(job_id=JobId("alice/j1"), at=40.0, kind="reason", why=WHY),
    TimelineEntry(job_id=JobId("alice/j1"), at=45.0, kind="forecast", forecast=FORECAST),
]


async def write_state(nc: NATS) -> None:
    """The records, alice/j1's explain entry and timeline (bob/b1's
    timeline interleaved: read by subject, it never shows)."""
    js = nc.jetstream()
    jobs = await js.key_value(subjects.KV_JOBS)
    for r in RECORDS:
        await jobs.put(r.job_id, msgspec.json.encode(r))
    explain = JobExplain(job_id=JobId("alice/j1"), at=50.0, why=WHY, receipt=RECEIPT,
                         forecast=FORECAST, round=7, estimated_throughput=120.0,
                         measured_throughput=100.0)
    kv = await js.key_value(subjects.KV_EXPLAIN)
    await kv.put("alice/j1", msgspec.json.encode(explain))
    for entry in TIMELINE:
        await js.publish(subjects.timeline("alice/j1"), msgspec.json.encode(entry))
        other = TimelineEntry(job_id=JobId("bob/b1"), at=entry.at, kind="reason")
        await js.publish(subjects.timeline("bob/b1"), msgspec.json.encode(other))


@pytest.fixture
async def api(nats_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with _served(gateway_settings(nats_url, timeout=0.5)) as client:
        yield client


class _served:
    """The app with its lifespan and the tenants file, as an HTTP client."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.app: FastAPI = create_app(settings, tenants=TENANTS)

    async def __aenter__(self) -> httpx.AsyncClient:
        self.lifespan = self.app.router.lifespan_context(self.app)
        await self.lifespan.__aenter__()
        transport = httpx.ASGITransport(app=self.app)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://gw")
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self.lifespan.__aexit__(None, None, None)


@asynccontextmanager
async def as_gateway(root: Path, write: Callable[[NATS], Awaitable[None]]
                     ) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway served under its own NATS identity, on a nats-server that
    admits only its nkeys, over the state ``write`` stored as the admin."""
    with secured_nats(root, [ADMIN_IDENTITY, GATEWAY]) as runtime:
        admin = await connect(runtime(ADMIN_IDENTITY), ADMIN_IDENTITY)
        await ensure_jetstream(admin.jetstream())
        await write(admin)
        try:
            async with _served(GatewaySettings(request_timeout=0.5,
                                               runtime=runtime(GATEWAY))) as client:
                yield client
        finally:
            await admin.close()


def by_type(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["conditions"]}


async def test_an_admin_sees_the_reason_receipt_forecast_and_conditions(
    api: httpx.AsyncClient, nc: NATS
) -> None:
    await write_state(nc)
    body = (await api.get("/jobs/j1", params={"tenant": "alice"}, headers=ADMIN)).json()
    assert body["why"]["code"] == "Priority"
    assert "bob/b1 (latency ratio 1.5)" in body["why"]["message"]
    assert body["why"]["details"]["jobs"] == ["bob/b1", "alice/a2"]
    assert body["receipt"]["rule"] == "Fairness" and body["receipt"]["takers"] == ["bob/b1"]
    assert (body["forecast"]["start_lo"], body["forecast"]["finish_hi"]) == (90.0, 600.0)
    assert body["throughput"] == {"estimated": 120.0, "measured": 100.0}
    c = by_type(body)
    assert (c["Scheduled"]["status"], c["Scheduled"]["reason"]) == ("False", "Priority")
    assert (c["Preempted"]["status"], c["Preempted"]["reason"]) == ("True", "Fairness")
    assert c["Preempted"]["since_time"] == "1970-01-01T00:00:30+00:00"
    running = (await api.get("/jobs/b1", params={"tenant": "bob"}, headers=ADMIN)).json()
    assert running["why"] is None and by_type(running)["Running"]["status"] == "True"


async def test_a_tenant_sees_another_tenants_job_as_such(api: httpx.AsyncClient,
                                                         nc: NATS) -> None:
    await write_state(nc)
    answer = await api.get("/jobs/j1", headers=ALICE)
    body = answer.json()
    assert answer.status_code == 200 and body["job_id"] == "j1"
    assert "b1" not in answer.text and "bob" not in answer.text
    assert body["why"]["details"]["jobs"] == [ANOTHER_TENANT, "a2"]
    assert body["why"]["message"].endswith(f": {ANOTHER_TENANT}, a2 (latency ratio 1.25)")
    assert body["receipt"]["takers"] == [ANOTHER_TENANT]
    assert by_type(body)["Preempted"]["message"].endswith(f"went to {ANOTHER_TENANT}")

    listed = await api.get("/jobs", headers=ALICE)
    whys = {j["job_id"]: j["why"] for j in listed.json()["jobs"]}
    assert whys["a2"] is None and whys["j1"]["details"]["jobs"] == [ANOTHER_TENANT, "a2"]
    assert "b1" not in listed.text

    timeline = await api.get("/jobs/j1/timeline", headers=ALICE)
    assert timeline.status_code == 200 and "b1" not in timeline.text
    entries = timeline.json()["entries"]
    assert [(e["at"], e["kind"]) for e in entries] == [(e.at, e.kind) for e in TIMELINE]
    assert entries[2]["receipt"]["takers"] == [ANOTHER_TENANT]
    assert entries[3]["why"]["details"]["jobs"] == [ANOTHER_TENANT, "a2"]
    assert entries[4]["forecast"]["position"] == 3
    assert timeline.json()["truncated"] is False


async def test_another_tenants_job_and_an_unknown_one_are_refused(
    api: httpx.AsyncClient, nc: NATS
) -> None:
    await write_state(nc)
    for path in ("/jobs/j1", "/jobs/j1/timeline", "/jobs/nope/timeline"):
        answer = await api.get(path, headers=BOB)
        assert (answer.status_code, answer.json()["code"]) == (404, "not_found"), path
    for path in ("/jobs/j1", "/jobs/j1/timeline"):
        answer = await api.get(path, params={"tenant": "alice"}, headers=BOB)
        assert answer.status_code == 403, path
    assert (await api.get("/jobs/j1/timeline", headers=ADMIN)).status_code == 404  # default's
    two = (await api.get("/jobs/j1/timeline", params={"tenant": "alice", "limit": 2},
                         headers=ADMIN)).json()
    assert [e["kind"] for e in two["entries"]] == ["submitted", "started"] and two["truncated"]
    assert (await api.get("/jobs/j1/timeline", params={"limit": 0},
                          headers=ALICE)).status_code == 400


async def test_the_queue_shows_reasons_positions_and_forecasts_redacted(
    api: httpx.AsyncClient, nc: NATS
) -> None:
    await write_state(nc)
    view = QueueView(leader="r1", term=2, entries=(
        QueueEntry(job_id=JobId("bob/b9"), priority=3.0, latency_ratio=2.0, in_window=True,
                   position=1, tenant_position=1),
        QueueEntry(job_id=JobId("alice/j1"), priority=2.0, latency_ratio=1.5, in_window=True,
                   why=WHY, position=2, tenant_position=1, forecast=FORECAST)))

    async def leader(msg: Msg) -> None:
        await msg.respond(msgspec.json.encode(view))

    sub = await nc.subscribe(subjects.QUEUE, cb=leader)
    await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
    await nc.flush()  # subscribed before the gateway asks
    try:
        mine = await api.get("/queue", headers=ALICE)
        everything = (await api.get("/queue", headers=ADMIN)).json()
    finally:
        await sub.unsubscribe()
    entries = mine.json()["entries"]
    assert [e["job_id"] for e in entries] == ["j1"] and "b1" not in mine.text
    assert entries[0]["why"]["code"] == "Priority" and entries[0]["position"] == 2
    assert entries[0]["forecast"]["start"] == 100.0
    assert [e["job_id"] for e in everything["entries"]] == ["bob/b9", "alice/j1"]
    assert everything["entries"][1]["why"]["details"]["jobs"] == ["bob/b1", "alice/a2"]


async def test_the_gateway_reads_them_under_its_own_identity(tmp_path: Path) -> None:
    async with as_gateway(tmp_path, write_state) as client:
        body = (await client.get("/jobs/j1", headers=ALICE)).json()
        timeline = (await client.get("/jobs/j1/timeline", headers=ALICE)).json()
    assert body["why"]["code"] == "Priority" and body["forecast"]["position"] == 3
    assert [e["kind"] for e in timeline["entries"]] == [e.kind for e in TIMELINE]


def test_the_gateway_reads_but_never_writes_the_explain_bucket_and_timeline() -> None:
    from tests.test_identity import may_publish

    assert may_publish(GATEWAY, f"$JS.API.DIRECT.GET.KV_{subjects.KV_EXPLAIN}.$KV.x.j1")
    assert may_publish(GATEWAY, f"$JS.API.STREAM.MSG.GET.{subjects.STREAM_TIMELINE.name}")
    assert not may_publish(GATEWAY, f"$KV.{subjects.KV_EXPLAIN}.j1")
    assert not may_publish(GATEWAY, subjects.timeline("j1"))
