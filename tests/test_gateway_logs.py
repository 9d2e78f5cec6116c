"""``GET /jobs/{id}/logs`` on a real nats-server: the test publishes log
chunks to stream ``HOPS_LOGS`` as executors do (two servers of alice's
job, one of bob's) and reads them through the gateway as an admin and as
tenants: a tenant reads its own job's lines, another tenant's job is a 404
like a missing one; ``rank``, ``tail`` and ``since`` filter; ``follow``
goes on with new lines and ends once the job is over and drained. The
gateway reads them under its own NATS identity too."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
from nats.aio.client import Client as NATS

from gateway import log_routes
from gateway.settings import GatewaySettings
from services.runtime.bus import connect, ensure_jetstream
from services.runtime.identity import ADMIN as ADMIN_IDENTITY
from services.runtime.identity import GATEWAY, executor_identity
from shared import subjects
from shared.logs import LogChunk, LogLine, encode_chunk
from tests.natsfix import nats_server, nats_url, secured_nats
from tests.test_gateway import gateway_settings, nc
from tests.test_gateway_explain import ADMIN, ALICE, BOB, _served, record

__all__ = ["nats_server", "nats_url", "nc"]  # fixtures

T0 = time.time() - 600.0


def chunk(job: str, server: str, rank: int, texts: list[str], at: float) -> LogChunk:
    return LogChunk(job_id=job, server_id=server, rank=rank, offset=0,
                    lines=[LogLine(at + i, t) for i, t in enumerate(texts)])


async def write_logs(nc: NATS, phase: str = "finished") -> None:
    js = nc.jetstream()
    jobs = await js.key_value(subjects.KV_JOBS)
    for r in (record("alice/j1", "alice", phase), record("bob/b1", "bob", "running")):
        await jobs.put(r.job_id, msgspec.json.encode(r))
    for c in (chunk("alice/j1", "s0", 0, ["a0-1", "a0-2"], T0),
              chunk("alice/j1", "s1", 0, ["b0-1"], T0 + 100),
              chunk("bob/b1", "s0", 0, ["secret"], T0),
              chunk("alice/j1", "s0", 1, ["a1-1", "a1-2", "a1-3"], T0 + 200)):
        await js.publish(subjects.logs(c.server_id, c.job_id), encode_chunk(c))


def lines(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in answer.text.splitlines() if line]


async def test_a_tenant_reads_its_own_jobs_logs_and_no_other(nats_url: str, nc: NATS) -> None:
    await write_logs(nc)
    async with _served(gateway_settings(nats_url, timeout=0.5)) as api:
        mine = lines(await api.get("/jobs/j1/logs", headers=ALICE))
        assert [(x["server"], x["rank"], x["text"]) for x in mine] == [
            ("s0", 0, "a0-1"), ("s0", 0, "a0-2"), ("s1", 0, "b0-1"),
            ("s0", 1, "a1-1"), ("s0", 1, "a1-2"), ("s0", 1, "a1-3")]
        assert set(mine[0]) == {"at", "server", "rank", "text", "capped"}
        admin = lines(await api.get("/jobs/j1/logs", params={"tenant": "alice"}, headers=ADMIN))
        assert admin == mine
        for path, who in (("/jobs/j1/logs", BOB), ("/jobs/b1/logs", ALICE),
                          ("/jobs/nope/logs", ALICE)):
            answer = await api.get(path, headers=who)
            assert (answer.status_code, answer.json()["code"]) == (404, "not_found"), path
            assert "secret" not in answer.text and "a0-1" not in answer.text
        other = await api.get("/jobs/j1/logs", params={"tenant": "alice"}, headers=BOB)
        assert other.status_code == 403


async def test_rank_tail_and_since_filter(nats_url: str, nc: NATS) -> None:
    await write_logs(nc)
    async with _served(gateway_settings(nats_url, timeout=0.5)) as api:
        rank1 = lines(await api.get("/jobs/j1/logs", params={"rank": 1}, headers=ALICE))
        assert [x["text"] for x in rank1] == ["a1-1", "a1-2", "a1-3"]
        tail = lines(await api.get("/jobs/j1/logs", params={"tail": 2}, headers=ALICE))
        assert [x["text"] for x in tail] == ["a1-2", "a1-3"]
        since = lines(await api.get("/jobs/j1/logs", params={"since": str(T0 + 150)},
                                    headers=ALICE))
        assert [x["text"] for x in since] == ["a1-1", "a1-2", "a1-3"]
        recent = lines(await api.get("/jobs/j1/logs", params={"since": "1m"}, headers=ALICE))
        assert recent == []  # every line is ten minutes old
        for bad in ({"since": "yesterday"}, {"tail": -1}, {"rank": -1}):
            answer = await api.get("/jobs/j1/logs", params=bad, headers=ALICE)
            assert (answer.status_code, answer.json()["code"]) == (400, "invalid"), bad


async def test_follow_streams_new_lines_and_ends_when_the_job_is_over(
        nats_url: str, nc: NATS) -> None:
    await write_logs(nc, phase="running")
    js = nc.jetstream()

    async def later() -> None:
        await asyncio.sleep(1.0)
        late = chunk("alice/j1", "s1", 0, ["late line"], time.time())
        await js.publish(subjects.logs("s1", "alice/j1"), encode_chunk(late))
        await asyncio.sleep(1.0)
        done = record("alice/j1", "alice", "finished")
        await (await js.key_value(subjects.KV_JOBS)).put(done.job_id, msgspec.json.encode(done))

    writer = asyncio.create_task(later())
    started = time.monotonic()
    async with _served(gateway_settings(nats_url, timeout=0.5)) as api:
        answer = await api.get("/jobs/j1/logs", params={"follow": "true"}, headers=ALICE,
                               timeout=30.0)
    await writer
    took = time.monotonic() - started
    texts = [x["text"] for x in lines(answer)]
    assert texts[-1] == "late line" and len(texts) == 7
    # It waited for the job to end and then for its output to drain, no longer.
    assert 2.0 + log_routes.DRAIN_S <= took < 2.0 + log_routes.DRAIN_S + 5.0


async def test_the_gateway_reads_them_under_its_own_identity(tmp_path: Path) -> None:
    with secured_nats(tmp_path, [ADMIN_IDENTITY, GATEWAY, executor_identity("s0")]) as runtime:
        admin = await connect(runtime(ADMIN_IDENTITY), ADMIN_IDENTITY)
        await ensure_jetstream(admin.jetstream())
        await write_logs(admin)
        # An executor publishes its own server's logs, with the stream's ack.
        s0 = await connect(runtime(executor_identity("s0")), executor_identity("s0"))
        own = chunk("alice/j1", "s0", 0, ["from the executor"], time.time())
        ack = await s0.jetstream().publish(subjects.logs("s0", "alice/j1"), encode_chunk(own))
        assert ack.stream == subjects.STREAM_LOGS.name
        await s0.close()
        settings = GatewaySettings(request_timeout=0.5, runtime=runtime(GATEWAY))
        async with _served(settings) as client:
            got = lines(await client.get("/jobs/j1/logs", headers=ALICE))
        await admin.close()
    assert got[-1]["text"] == "from the executor" and len(got) == 7
