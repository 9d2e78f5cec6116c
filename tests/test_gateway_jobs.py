"""``GET /jobs`` a page at a time, and ``hops jobs`` following the cursor.

The records are written to ``hops_jobs`` on a real nats-server as the
scheduler writes them; the gateway is the app with its lifespan, and for the
command a ``python -m gateway`` process.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from nats.aio.client import Client as NATS
from typer.testing import CliRunner

from cli.main import app as hops_app
from gateway.pages import DEFAULT_LIMIT, MAX_LIMIT, Cursor, JobQuery, select
from shared import subjects
from shared.job import JobSpec
from shared.jobkeys import job_key
from shared.records import JobRecord
from tests.helpers import free_port
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import ROOT, api, nc, spec_json

__all__ = ["api", "nats_server", "nats_url", "nc"]  # fixtures

PHASES = ("queued", "running", "finished")


def job(n: int, *, at: float | None = None, tenant: str = "") -> JobRecord:
    """Job ``j{n:05d}``: submitted at ``n`` s, of tenant ``t{n % 3}``, in a
    phase that cycles through :data:`PHASES`."""
    spec = msgspec.convert(spec_json(f"j{n:05d}", tenant=tenant or f"t{n % 3}"), JobSpec)
    return JobRecord(spec=spec, submitted_at=float(n) if at is None else at,
                     phase=PHASES[n % 3])  # type: ignore[arg-type]


async def put(nc: NATS, records: list[JobRecord]) -> None:
    kv = await nc.jetstream().key_value(subjects.KV_JOBS)
    for r in records:
        await kv.put(r.job_id, msgspec.json.encode(r))


def ids(body: dict[str, Any]) -> list[str]:
    return [j["job_id"] for j in body["jobs"]]


# --- pure -------------------------------------------------------------------------------


def test_a_page_ends_at_its_limit_and_the_cursor_survives_inserts() -> None:
    records = [job(n) for n in range(10)]
    first, total, cursor = select(records, JobQuery(limit=4))
    assert [r.job_id for r in first] == [f"j{n:05d}" for n in range(4)] and total == 10
    assert cursor is not None
    # Jobs submitted meanwhile, and one that sorts before the cursor (a
    # replica's clock behind): the next page goes on after the last job shown.
    later = [*records, job(10), job(11), job(99, at=2.5)]
    rest, _, cursor = select(later, JobQuery(limit=100, after=Cursor.decode(cursor)))
    assert [r.job_id for r in rest] == [f"j{n:05d}" for n in range(4, 12)]
    assert cursor is None
    # Ties on submission time are ordered by id, and the cursor keeps them apart.
    ties = [job(n, at=1.0) for n in (3, 1, 2)]
    one, _, c = select(ties, JobQuery(limit=1))
    two, _, _ = select(ties, JobQuery(limit=5, after=Cursor.decode(c or "")))
    assert [r.job_id for r in one + two] == ["j00001", "j00002", "j00003"]


def test_a_cursor_not_issued_by_a_gateway_is_refused() -> None:
    good = Cursor(at=1.5, id="j1")
    assert Cursor.decode(good.encode()) == good
    forged = base64.urlsafe_b64encode(b'{"at": 1, "id": "j", "v": 9}').decode()
    for text in ("", "not base64!", "bm90IGpzb24", forged):
        with pytest.raises(ValueError, match="was not issued by this gateway"):
            Cursor.decode(text)


# --- the gateway on NATS ------------------------------------------------------------------


async def test_get_jobs_pages_filters_and_refuses_bad_parameters(
    api: httpx.AsyncClient, nc: NATS
) -> None:
    await put(nc, [job(n) for n in range(2000)])
    first = await api.get("/jobs")
    body = first.json()
    assert first.status_code == 200 and len(first.content) < 120_000  # was about 1 MB
    assert (body["count"], body["total"]) == (DEFAULT_LIMIT, 2000)
    assert ids(body)[:2] == ["j00000", "j00001"] and body["next_cursor"]

    seen = ids(body)
    cursor = body["next_cursor"]
    await put(nc, [job(2000), job(2001)])  # submitted while the client pages
    while cursor:
        page = (await api.get("/jobs", params={"limit": MAX_LIMIT, "cursor": cursor})).json()
        assert page["count"] <= MAX_LIMIT
        seen += ids(page)
        cursor = page["next_cursor"]
    assert seen == [f"j{n:05d}" for n in range(2002)]

    mine = (await api.get("/jobs", params={"tenant": "t1", "phase": "running",
                                           "limit": 5})).json()
    assert ids(mine) == ["j00001", "j00004", "j00007", "j00010", "j00013"]
    assert mine["total"] == 667 and mine["next_cursor"]
    assert (await api.get("/jobs", params={"tenant": "nobody"})).json()["jobs"] == []

    for params, words in [
        ({"limit": "0"}, "limit='0' is invalid: input should be greater than or equal to 1"),
        ({"limit": "1001"}, "limit='1001' is invalid: input should be less than or equal"),
        ({"limit": "ten"}, "limit='ten' is invalid: input should be a valid integer"),
        ({"cursor": "garbage"}, "cursor 'garbage' was not issued by this gateway"),
        ({"phase": "bogus"}, "unknown phase 'bogus'; expected one of: submitted"),
    ]:
        r = await api.get("/jobs", params=params)
        assert r.status_code == 400, params
        assert r.json()["code"] == "invalid" and words in r.json()["error"], r.json()


async def test_openapi_describes_the_pages(api: httpx.AsyncClient) -> None:
    schema = (await api.get("/openapi.json")).json()
    listing = schema["paths"]["/jobs"]["get"]
    params = {p["name"]: p["schema"] for p in listing["parameters"]}
    assert set(params) == {"phase", "tenant", "limit", "cursor"}
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, MAX_LIMIT)
    assert params["limit"]["default"] == DEFAULT_LIMIT
    assert "running" in params["phase"]["enum"]
    assert set(listing["responses"]) == {"200", "400", "401", "403"}
    page = schema["components"]["schemas"]["JobPage"]
    assert set(page["required"]) == {"jobs", "count", "total", "next_cursor"}
    assert {"JobRecord", "Error"} <= set(schema["components"]["schemas"])
    # parameter errors are the gateway's 400, never FastAPI's 422
    assert "HTTPValidationError" not in json.dumps(schema)


# --- hops jobs against a gateway process --------------------------------------------------


@pytest.fixture
def gateway(nats_url: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "HOPS_NATS_URL": nats_url, "HOPS_GATEWAY_PORT": str(port),
           "HOPS_GATEWAY_INSECURE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "no gateway"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)


def hops(gateway: str, *args: str) -> Any:
    return CliRunner().invoke(hops_app, ["jobs", *args], env={"HOPS_GATEWAY_URL": gateway})


async def test_hops_jobs_follows_the_cursor_or_stops_at_its_limit(
    gateway: str, nc: NATS
) -> None:
    await put(nc, [job(n) for n in range(MAX_LIMIT + 50)])
    every = hops(gateway, "--json")
    assert every.exit_code == 0, every.output
    body = json.loads(every.output)
    assert ids(body) == [f"j{n:05d}" for n in range(MAX_LIMIT + 50)]  # two pages
    assert body["next_cursor"] is None

    some = hops(gateway, "--limit", str(MAX_LIMIT + 5), "--json")
    assert len(ids(json.loads(some.output))) == MAX_LIMIT + 5
    text = hops(gateway, "--limit", "2", "--tenant", "t0")
    lines = text.output.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["j00000", "j00003"]
    assert lines[3] == "2 of 350 jobs shown; raise --limit to see more"
    assert "no jobs" in hops(gateway, "--tenant", "nobody").output
    bad = hops(gateway, "--phase", "bogus")
    assert bad.exit_code == 1 and "unknown phase 'bogus'" in bad.output


async def test_a_tenants_record_is_found_by_its_key_or_as_written_before_keys(
    api: httpx.AsyncClient, nc: NATS
) -> None:
    legacy = job(1, tenant="alice")  # under its bare id, as before keys were qualified
    keyed = job(2, tenant="alice")
    keyed = msgspec.structs.replace(keyed, spec=msgspec.structs.replace(
        keyed.spec, id=job_key("alice", keyed.spec.id)))
    await put(nc, [legacy, keyed])
    for job_id in ("j00001", "j00002"):
        r = await api.get(f"/jobs/{job_id}", params={"tenant": "alice"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["job_id"], body["spec"]["id"], body["spec"]["tenant"]) == (
            job_id, job_id, "alice")
        # a bare id, for an admin, is the default tenant's: not alice's job
        r = await api.get(f"/jobs/{job_id}")
        assert (r.status_code, r.json()["error"]) == (404, f"no job {job_id!r}")
    listed = (await api.get("/jobs")).json()["jobs"]
    assert [(j["job_id"], j["spec"]["tenant"]) for j in listed] == [
        ("j00001", "alice"), ("j00002", "alice")]
