"""The leader's explanations on a real nats-server (services/scheduler/explainer.py):
a receipt reaches the job's timeline, its hops_explain record and its
tenant's feed (where another tenant's job is "another tenant's job"), a stop
its receipt told is not told twice, a new leader reads the same records, and
a job's record goes when it ends while its timeline stays; the forecast's
calibration is written as a start resolves a forecast and a new leader
loads it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from structlog import get_logger

from scheduling.forecast.tracking import decode, encode, opened
from scheduling.live.state import LiveJobRecord
from services.runtime.bus import ErrorReporter
from services.runtime.kv import pack
from services.runtime.objects import get_object
from services.runtime.service import ServiceContext
from services.runtime.settings import RuntimeSettings
from services.scheduler.explainer import Explainer
from shared import events as ev
from shared import subjects
from shared.configuration import Configuration
from shared.explain import ANOTHER_TENANT, CALIBRATION_KEY, JobForecast, QueueForecast, Why
from shared.explain_events import JobExplained, decode_feed
from shared.ids import JobId, TenantId
from shared.job import JobSpec
from shared.jobkeys import job_key
from shared.snapshot import Plan, PlanReasons, Snapshot
from tests.helpers import cluster
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import nc

__all__ = ["nats_server", "nats_url", "nc"]  # fixtures

A1, A2, B1 = job_key("alice", "a1"), job_key("alice", "a2"), job_key("bob", "b1")


def record(key: JobId, phase: str) -> LiveJobRecord:
    tenant = key.split("/")[0]
    spec = JobSpec(id=key, model="m", batch_size=32, params=10_000_000, total_samples=1000,
                   requirements=(1,), tenant=TenantId(tenant), time_limit=60.0)
    rec = LiveJobRecord(spec=spec, submitted_at=0.0, samples_done=250.0)
    return msgspec.structs.replace(rec, phase=phase)  # type: ignore[arg-type]


def explainer(nc: NATS, records: dict[JobId, LiveJobRecord], term: int = 1) -> Explainer:
    ctx = ServiceContext("scheduler", RuntimeSettings(), nc, nc.jetstream(), get_logger(),
                         ErrorReporter(nc, "scheduler"))
    return Explainer(ctx, get_logger(), term, 60.0, lambda: records)


async def timeline(nc: NATS, key: str) -> list[dict[str, Any]]:
    sub = await nc.jetstream().subscribe(subjects.timeline(key), ordered_consumer=True)
    out: list[dict[str, Any]] = []
    try:
        while True:
            msg = await sub.next_msg(timeout=0.5)
            out.append(json.loads(msg.data))
            if not msg.metadata.num_pending:
                return out
    finally:
        await sub.unsubscribe()


async def test_receipts_and_reasons_reach_the_timeline_the_bucket_and_the_feed(nc: NATS) -> None:
    feed: list[Msg] = []

    async def keep(msg: Msg) -> None:
        feed.append(msg)

    await nc.subscribe("hops.v1.tenants.alice.events.*", cb=keep)
    records = {A1: record(A1, "running"), A2: record(A2, "queued"), B1: record(B1, "running")}
    ex = explainer(nc, records)
    await ex.open()
    await ex.time_limit(A1, 100.0)  # the leader ended a1 at its limit
    why = Why(code="Priority", message="higher-priority jobs took what it needs",
              jobs=(B1, A1), ratios=(3.0, 2.0))
    snap = Snapshot(now=101.0, cluster=cluster([("A", 1, 1)]), jobs=())
    await ex.after_plan(snap, Plan(reasons=PlanReasons("hops", why={A2: why})), 4,
                        drained=(), lost=())
    # the job_stopped the stop brings is not told again
    await ex.on_event(records[A1], ev.JobStopped(job_id=A1, at=100.5, reason="TimeLimit"))
    (stop,) = await timeline(nc, A1)
    assert stop["kind"] == "stopped" and stop["receipt"]["rule"] == "TimeLimit", stop
    assert stop["receipt"]["samples_kept"] == 250.0
    stored = await nc.jetstream().key_value(subjects.KV_EXPLAIN)
    a1 = json.loads((await stored.get(A1)).value or b"{}")
    assert a1["receipt"]["rule"] == "TimeLimit" and a1["why"] is None
    a2 = json.loads((await stored.get(A2)).value or b"{}")
    assert (a2["why"]["code"], a2["round"]) == ("Priority", 4)
    await asyncio.sleep(0.2)
    shown = [decode_feed(m.data) for m in feed]
    assert all(isinstance(m, JobExplained) for m in shown)
    texts = {m.job_id: m.text for m in shown if isinstance(m, JobExplained)}
    assert set(texts) == {"a1", "a2"}
    assert ANOTHER_TENANT in texts["a2"] and "a1" in texts["a2"]
    assert not [m for m in feed if b"bob" in m.data]

    # a new leader reads what the last one wrote; once a1 ends, its record goes
    successor = explainer(nc, records, term=2)
    await successor.open()
    await successor.load()
    assert successor.explained == ex.explained
    records[A1] = record(A1, "cancelled")
    await successor.write(102.0)
    assert A1 not in successor.explained and A1 not in set(await stored.keys())
    assert [e["kind"] for e in await timeline(nc, A1)] == ["stopped"]  # the history stays
    ex.close()
    successor.close()


async def test_the_calibration_is_written_as_it_changes_and_a_new_leader_loads_it(
        nc: NATS) -> None:
    records = {A2: record(A2, "queued")}
    ex = explainer(nc, records)
    await ex.open()
    raw = QueueForecast(at=0.0, draws=8, jobs=(JobForecast(
        job_id=A2, position=1, tenant_position=1, start=120.0, start_lo=90.0, start_hi=150.0,
        finish=900.0, finish_lo=840.0, finish_hi=960.0),))
    opened(ex.tracker, raw, started=())
    records[A2] = record(A2, "running")
    start = ev.JobStarted(job_id=A2, configuration=Configuration.of({"n0": 1}), at=180.0)
    await ex.on_event(records[A2], start)  # resolves its start forecast, and writes
    assert len(ex.tracker.calibration.start) == 1 and A2 not in ex.tracker.open_start
    js = nc.jetstream()
    assert decode(await get_object(js, subjects.OBJ_STATE, CALIBRATION_KEY) or b"") == ex.tracker
    successor = explainer(nc, records, term=2)
    await successor.open()
    await successor.load()
    assert successor.tracker == ex.tracker
    assert CALIBRATION_KEY not in successor.explained
    await successor.on_event(records[A2], start)  # delivered again: nothing to resolve
    assert successor.tracker == ex.tracker
    ex.close()
    successor.close()


async def test_a_calibration_left_in_hops_explain_by_an_earlier_version_is_loaded(
        nc: NATS) -> None:
    records = {A2: record(A2, "queued")}
    ex = explainer(nc, records)
    opened(ex.tracker, QueueForecast(at=0.0, draws=8, jobs=(JobForecast(
        job_id=A2, position=1, tenant_position=1, start=120.0, start_lo=90.0, start_hi=150.0,
        finish=900.0, finish_lo=840.0, finish_hi=960.0),)), started=())
    stored = await nc.jetstream().key_value(subjects.KV_EXPLAIN)
    for key, value in pack(CALIBRATION_KEY, encode(ex.tracker), limit=64):  # in parts
        await stored.put(key, value)
    successor = explainer(nc, records, term=2)
    await successor.open()
    await successor.load()
    assert successor.tracker == ex.tracker and A2 in successor.tracker.open_start
    assert not successor.explained  # its parts are no job's record
    ex.close()
    successor.close()
