"""The HTTP gateway against a real nats-server: the reply -> HTTP mapping and
the size limit (TestClient), the KV views (records written as their owners
write them), the real scheduler process behind ``POST /jobs`` and
``DELETE /jobs``, and ``python -m gateway`` as a process."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from gateway import views
from gateway.app import create_app
from gateway.pages import JobQuery
from gateway.settings import GatewaySettings, from_env, parse
from services.runtime.bus import connect, ensure_jetstream
from services.runtime.settings import RuntimeSettings, SettingsError
from shared import events as ev
from shared import subjects
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.events import MAX_PAYLOAD
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import JobRecord, NodeRecord, Placement
from tests.helpers import free_port
from tests.natsfix import nats_server, nats_url

__all__ = ["nats_server", "nats_url"]  # fixtures

ROOT = Path(__file__).resolve().parent.parent


def has_main(module: str) -> bool:
    try:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    except ImportError:
        return False


needs_scheduler = pytest.mark.skipif(
    not has_main("services.scheduler"),
    reason="services.scheduler cannot run yet (no services/scheduler/__main__.py)",
)


def spec_json(job_id: str, **kw: Any) -> dict[str, Any]:
    body = {"id": job_id, "model": "resnet50", "batch_size": 32, "params": 25_557_032,
            "total_samples": 1_000_000, "requirements": [1, 2]}
    body.update(kw)
    return body


def gateway_settings(url: str, timeout: float = 2.0) -> GatewaySettings:
    runtime = RuntimeSettings(nats_servers=(url,), reconnect_wait=0.1)
    return GatewaySettings(request_timeout=timeout, runtime=runtime)


@pytest.fixture
def client(nats_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(gateway_settings(nats_url), tenants=None)) as c:
        yield c


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await connect(RuntimeSettings(nats_servers=(nats_url,)), "test")
    await ensure_jetstream(conn.jetstream())
    yield conn
    await conn.close()


@pytest.fixture
async def api(nats_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app in the test's own event loop (so that the test can serve NATS
    requests while the gateway waits on them), lifespan included."""
    app: FastAPI = create_app(gateway_settings(nats_url, timeout=0.5), tenants=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            yield c


async def eventually(condition: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await condition() if asyncio.iscoroutinefunction(condition) else condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)


# --- pure parts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [("malformed", 400), ("unknown_type", 400), ("invalid", 422), ("too_large", 413),
     ("conflict", 409), ("duplicate", 409), ("not_found", 404), ("internal", 502),
     ("something_new", 502)],
)
def test_reply_codes_map_to_statuses(code: str, status: int) -> None:
    assert views.reply_status(ev.error_reply(code, "x")) == status
    assert views.reply_status(ev.Reply(ok=True, job_id="j"), ok_status=201) == 201


def test_size_checks_and_phases() -> None:
    assert views.declared_too_large(str(MAX_PAYLOAD + 1), MAX_PAYLOAD)
    assert not views.declared_too_large(str(MAX_PAYLOAD), MAX_PAYLOAD)
    assert not views.declared_too_large(None, 10) and not views.declared_too_large("x", 10)
    assert views.check_phase("queued") == "queued" and views.check_phase(None) is None
    with pytest.raises(ValueError, match="unknown phase 'bogus'"):
        views.check_phase("bogus")


def record(job_id: str, phase: str = "queued", at: float = 1.0, **kw: Any) -> JobRecord:
    spec = msgspec.convert(spec_json(job_id), JobSpec)
    return JobRecord(spec=spec, submitted_at=at, phase=phase, **kw)  # type: ignore[arg-type]


def node(sid: str, gpus: int = 4, order: int = 0, alive: bool = True) -> NodeRecord:
    server = Server(ServerId(sid), GpuType("RTX3090"), gpus)
    return NodeRecord(server=server, gpu_type=GpuTypeSpec(GpuType("RTX3090"), 2.5e9, 1e9),
                      order=order, alive=alive)


def placement(job_id: str, indices: dict[str, tuple[int, ...]], mode: str = "run") -> Placement:
    config = Configuration.of({s: len(i) for s, i in indices.items()})
    return Placement(job_id=JobId(job_id), configuration=config, mode=mode,  # type: ignore[arg-type]
                     gpu_indices={ServerId(s): i for s, i in indices.items()})


def test_jobs_view_filters_sorts_and_writes_infinities_as_strings() -> None:
    records = [record("b", at=2.0), record("a", "running", at=3.0,
                                           attained_by_type={GpuType("x"): float("inf")}),
               record("c", at=1.0)]
    view = views.jobs_view(records, 10.0)
    assert [j["job_id"] for j in view["jobs"]] == ["c", "b", "a"]
    assert view["jobs"][2]["attained_by_type"] == {"x": "inf"}
    assert views.jobs_view(records, 10.0, JobQuery(phase="running"))["count"] == 1


def test_job_view_says_how_long_each_job_waited_and_ran() -> None:
    queued = views.job_view(record("q", at=100.0), now=160.0)
    assert (queued["waited_s"], queued["ran_s"]) == (60.0, 0.0)
    running = views.job_view(record("r", "running", at=100.0, first_start=130.0), now=200.0)
    assert (running["waited_s"], running["ran_s"]) == (30.0, 70.0)
    ended = record("f", "finished", at=100.0, first_start=110.0, finished_at=150.0)
    assert views.job_times(ended, now=999.0) == {"waited_s": 10.0, "ran_s": 40.0}
    never = record("c", "cancelled", at=100.0, finished_at=125.0)
    assert views.job_times(never, now=999.0) == {"waited_s": 25.0, "ran_s": 0.0}
    assert queued["submitted_at"] == 100.0 and queued["spec"]["tenant"] == "default"


def test_cluster_view_shows_holders_totals_and_problems() -> None:
    nodes = [node("s1", order=1), node("s0", gpus=2, order=0), node("s2", alive=False)]
    placements = [
        placement("j1", {"s0": (0,), "s1": (1, 2)}),
        placement("p", {"s1": (2,)}, "profile"),
        placement("ghost", {"nowhere": (0,)}),
    ]
    view = views.cluster_view(nodes, placements)
    assert [s["id"] for s in view["servers"]] == ["s0", "s2", "s1"]  # (order, id)
    s1 = view["servers"][2]
    assert s1["used"] == 2 and s1["free"] == 2 and s1["jobs"] == ["j1"]
    assert [g["job_id"] for g in s1["gpu_slots"]] == [None, "j1", "j1", None]
    assert view["servers"][1]["free"] == 0  # a dead server offers nothing
    # GPU totals count alive servers only, as the monitor's metrics do
    assert view["totals"]["gpus"] == 6 and view["totals"]["used"] == 3
    assert view["totals"]["lost_gpus"] == 4 and view["servers"][1]["state"] == "lost"
    assert (view["totals"]["alive_servers"], view["totals"]["lost_servers"]) == (2, 1)
    assert view["double_booked"] == [{"server_id": "s1", "gpu": 2, "jobs": ["j1", "p"]}]
    assert view["unknown_servers"] == {"nowhere": ["ghost"]}


def test_settings_from_env_and_flags() -> None:
    env = {"HOPS_GATEWAY_PORT": "9001", "HOPS_GATEWAY_HOST": "0.0.0.0",
           "HOPS_GATEWAY_TIMEOUT_S": "1.5", "HOPS_NATS_URL": "nats://n:1"}
    s = from_env(env)
    assert (s.host, s.port, s.request_timeout) == ("0.0.0.0", 9001, 1.5)
    s = parse(["--port", "9002", "--nats-url", "nats://m:2"], env)
    assert s.port == 9002 and s.host == "0.0.0.0" and s.runtime.nats_url == "nats://m:2"
    # on a NATS cluster a submission may wait out a leader election (8 s) at its first try
    assert parse([], {}).request_timeout == 5.0
    assert parse([], {"HOPS_NATS_REPLICAS": "3"}).request_timeout == 9.0
    assert parse([], {"HOPS_NATS_REPLICAS": "3", "HOPS_GATEWAY_TIMEOUT_S": "2"}
                 ).request_timeout == 2.0
    for bad in ({"HOPS_GATEWAY_PORT": "x"}, {"HOPS_GATEWAY_PORT": "70000"},
                {"HOPS_GATEWAY_TIMEOUT_S": "0"}):
        with pytest.raises(SettingsError, match="HOPS_GATEWAY"):
            from_env(bad)


# --- with NATS, no scheduler ------------------------------------------------------------


def test_without_a_scheduler_requests_are_503_and_health_is_ok(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"service": "gateway", "ok": True, "nats": "connected"}
    r = client.post("/jobs", json=spec_json("j1"))
    assert r.status_code == 503 and r.json()["code"] == "unavailable"
    assert "hops.v1.jobs.submit" in r.json()["error"]
    assert r.headers["Retry-After"] == str(views.RETRY_AFTER_S)  # no responders: transient
    for r in (client.delete("/jobs/j1"), client.get("/queue")):
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert client.get("/jobs").json() == {"jobs": [], "count": 0, "total": 0, "next_cursor": None}
    assert client.get("/jobs/j1").status_code == 404
    assert client.get("/jobs?phase=bogus").status_code == 400
    assert client.get("/cluster").json()["totals"]["gpus"] == 0


def test_bodies_above_the_limit_are_413_before_nats(client: TestClient) -> None:
    big = json.dumps(spec_json("big", model="m" * MAX_PAYLOAD)).encode()
    r = client.post("/jobs", content=big)
    assert r.status_code == 413 and r.json()["code"] == "too_large"
    assert str(MAX_PAYLOAD) in r.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        for _ in range(5):
            yield b" " * (MAX_PAYLOAD // 4)

    r = client.post("/jobs", content=chunks())
    assert r.status_code == 413
    # at the limit it goes on to NATS (no scheduler here: 503)
    assert client.post("/jobs", content=b" " * MAX_PAYLOAD).status_code == 503


def test_openapi_documents_the_submit_body(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert {"JobSpec", "SubmitJob"} <= set(schema["components"]["schemas"])
    assert "/jobs/{job_id}" in schema["paths"] and "/cluster" in schema["paths"]
    assert client.get("/docs").status_code == 200


async def test_a_too_large_body_is_reported_on_the_error_subject(
    api: httpx.AsyncClient, nc: NATS
) -> None:
    errors: asyncio.Queue[ev.ErrorRecord] = asyncio.Queue()

    async def on_error(msg: Msg) -> None:
        await errors.put(ev.decode_error_record(msg.data))

    await nc.subscribe(subjects.ERRORS, cb=on_error)
    await asyncio.sleep(0)
    await nc.flush()
    r = await api.post("/jobs", content=b"x" * (MAX_PAYLOAD + 1))
    assert r.status_code == 413
    err = await asyncio.wait_for(errors.get(), 5)
    assert (err.service, err.code, err.subject) == ("gateway", "too_large", subjects.JOBS_SUBMIT)


async def test_upstream_failures_are_502_or_503(api: httpx.AsyncClient, nc: NATS) -> None:
    """A stand-in answering what the real scheduler rarely does: an internal
    failure, a reply that is not a Reply, and silence."""
    answers = iter([ev.encode(ev.error_reply("internal", "boom")), b"not json", None])

    async def respond(msg: Msg) -> None:
        data = next(answers)
        if data is not None:
            await msg.respond(data)

    await nc.subscribe(subjects.JOBS_SUBMIT, cb=respond)
    await asyncio.sleep(0)
    await nc.flush()
    r = await api.post("/jobs", json=spec_json("j"))
    assert (r.status_code, r.json()["code"], r.json()["error"]) == (502, "internal", "boom")
    r = await api.post("/jobs", json=spec_json("j"))
    assert (r.status_code, r.json()["code"]) == (502, "bad_gateway")
    assert "Retry-After" not in r.headers  # only a 503 is transient
    r = await api.post("/jobs", json=spec_json("j"))
    assert r.status_code == 503 and "within 0.5 s" in r.json()["error"]
    assert r.headers["Retry-After"] == "1"  # a timeout is transient too


async def test_jobs_and_cluster_come_from_the_kv_buckets(api: httpx.AsyncClient, nc: NATS) -> None:
    js = nc.jetstream()
    jobs = await js.key_value(subjects.KV_JOBS)
    for r in (record("a", "running", at=2.0), record("b", "queued", at=1.0)):
        await jobs.put(r.job_id, msgspec.json.encode(r))
    await jobs.put("junk", b"{not a record")  # left out, not a 500
    nodes = await js.key_value(subjects.KV_NODES)
    await nodes.put("s0", msgspec.json.encode(node("s0")))
    alloc = await js.key_value(subjects.KV_ALLOC)
    await alloc.put("a", msgspec.json.encode(placement("a", {"s0": (0, 1)})))
    await alloc.put("gone", msgspec.json.encode(placement("gone", {"s0": (3,)})))
    await alloc.delete("gone")  # released: not shown

    body = (await api.get("/jobs")).json()
    assert [j["job_id"] for j in body["jobs"]] == ["b", "a"]
    assert (await api.get("/jobs", params={"phase": "running"})).json()["count"] == 1
    one = (await api.get("/jobs/a")).json()
    assert one["phase"] == "running" and one["spec"]["model"] == "resnet50"
    assert (await api.get("/jobs/nope")).status_code == 404
    assert (await api.get("/jobs/a.b")).status_code == 404
    cluster = (await api.get("/cluster")).json()
    assert cluster["servers"][0]["jobs"] == ["a"]
    assert cluster["totals"] == {"servers": 1, "alive_servers": 1, "lost_servers": 0, "gpus": 4,
                                 "used": 2, "free": 2, "lost_gpus": 0, "placements": 1,
                                 "cores": 0, "cores_used": 0, "cores_free": 0,
                                 "memory_mb": 0, "memory_mb_used": 0, "memory_mb_free": 0,
                                 "by_gpu_type": {"RTX3090": {"gpus": 4, "used": 2, "free": 2,
                                                             "lost_gpus": 0}}}


# --- with the real scheduler process ----------------------------------------------------


@pytest.fixture
def scheduler(nats_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "HOPS_NATS_URL": nats_url, "HOPS_ROUND_S": "1",
           "HOPS_PRIORITY_REFRESH_S": "1", "HOPS_LEADER_TTL": "3", "HOPS_HEALTH_PORT": ""}
    log = (tmp_path / "scheduler.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.scheduler"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_for(client: TestClient, probe: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.1)


@needs_scheduler
def test_submit_and_cancel_through_the_real_scheduler(
    client: TestClient, scheduler: subprocess.Popen[bytes]
) -> None:
    # the scheduler answers admission once it is up: a malformed body is then a 400
    wait_for(client, lambda: client.post("/jobs", content=b"{").status_code == 400, "admission")
    r = client.post("/jobs", json=spec_json("j1"))
    assert r.status_code == 201, r.text
    assert r.json() == {"ok": True, "job_id": "j1"} and r.headers["location"] == "/jobs/j1"
    tagged = {"type": "submit_job", "spec": spec_json("j2", requirements=[], min_gpus=1,
                                                      max_gpus=4)}
    assert client.post("/jobs", json=tagged).status_code == 201
    again = client.post("/jobs", json=spec_json("j1"))  # the very spec: its acceptance
    assert again.status_code == 201 and again.headers["location"] == "/jobs/j1", again.text
    assert client.post("/jobs", json=spec_json("j1", batch_size=64)).status_code == 409
    assert client.post("/jobs", json=spec_json("j3", batch_size=0)).status_code == 422
    assert client.post("/jobs", json=spec_json("a.b")).status_code == 422
    assert client.post("/jobs", json={"type": "nope"}).status_code == 400
    assert client.post("/jobs", content=b"{\"id\": \"j").status_code == 400
    wait_for(client, lambda: client.get("/jobs/j1").status_code == 200, "record of j1")
    assert {j["job_id"] for j in client.get("/jobs").json()["jobs"]} == {"j1", "j2"}

    assert client.delete("/jobs/ghost").status_code == 404
    r = client.delete("/jobs/j1", params={"reason": "test"})
    assert r.status_code == 200 and r.json()["job_id"] == "j1"
    wait_for(client, lambda: client.get("/jobs/j1").json()["phase"] == "cancelled", "cancel")
    assert client.delete("/jobs/j1").status_code == 409
    assert [j["job_id"] for j in client.get("/jobs?phase=cancelled").json()["jobs"]] == ["j1"]
    wait_for(client, lambda: client.get("/queue").status_code == 200, "a leader")
    assert client.get("/queue").json()["term"] >= 1

    def waiting() -> set[str]:
        return {e["job_id"] for e in client.get("/queue").json()["entries"]}

    wait_for(client, lambda: waiting() == {"j2"}, "a queue view without the cancelled job")


# --- python -m gateway ---------------------------------------------------------------------


def test_the_gateway_process_serves_and_stops_on_sigterm(nats_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "HOPS_NATS_URL": nats_url, "HOPS_GATEWAY_PORT": str(port),
           "HOPS_GATEWAY_INSECURE": "1"}
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        assert r.json()["ok"] is True
        assert "swagger" in httpx.get(f"http://127.0.0.1:{port}/docs").text.lower()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("event") == "gateway connected" for line in lines)
    assert all(line["service"] == "gateway" for line in lines)


def test_the_gateway_process_refuses_bad_settings() -> None:
    env = {**os.environ, "HOPS_GATEWAY_PORT": "eighty"}
    done = subprocess.run([sys.executable, "-m", "gateway"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "HOPS_GATEWAY_PORT must be an integer" in done.stderr
