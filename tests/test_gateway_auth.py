"""Identity on the gateway, over real HTTP: a ``python -m gateway`` process
and a scheduler process, both given a tenants file (``HOPS_TENANTS``), on a
real nats-server. Tenants see and cancel only their own jobs, an admin sees
and does everything, refusals are 401/403 with the gateway's error shape and
each is audited on ``hops.v1.errors``; the OpenAPI schema declares the
bearer scheme; the gateway serves HTTPS from given certificate files; the
CLI sends its token."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from fastapi.testclient import TestClient
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from typer.testing import CliRunner

from cli.main import app as hops_app
from cli.up.launcher import free_port
from gateway.app import create_app
from shared import events as ev
from shared import subjects
from shared.tenants import load_tenants
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import ROOT, gateway_settings, nc, spec_json

__all__ = ["nats_server", "nats_url", "nc"]  # fixtures

TENANTS_YAML = """\
tenants:
  alice: {tokens: ["alice-token"]}
  bob: {tokens: ["bob-token"], run_commands: true}
admins:
  ops: {tokens: ["admin-token"]}
"""
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
ADMIN = {"Authorization": "Bearer admin-token"}


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS_YAML)
    return path


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**os.environ, **env},
                                stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def scheduler(nats_url: str, tenants_file: Path, tmp_path: Path
              ) -> Iterator[subprocess.Popen[bytes]]:
    env = {"HOPS_NATS_URL": nats_url, "HOPS_ROUND_S": "1", "HOPS_PRIORITY_REFRESH_S": "1",
           "HOPS_LEADER_TTL": "3", "HOPS_HEALTH_PORT": "", "HOPS_TENANTS": str(tenants_file)}
    proc = start(["-m", "services.scheduler"], env, tmp_path / "scheduler.log")
    try:
        yield proc
    finally:
        stop(proc)


def serve_gateway(nats_url: str, tmp_path: Path, extra: dict[str, str], scheme: str = "http",
                  verify: ssl.SSLContext | bool = True) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = tmp_path / f"gateway-{port}.log"
    env = {"HOPS_NATS_URL": nats_url, "HOPS_GATEWAY_PORT": str(port), **extra}
    proc = start(["-m", "gateway"], env, log)
    url = f"{scheme}://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=1, verify=verify)
            return proc, url
        except httpx.TransportError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)


@pytest.fixture
def gateway(nats_url: str, tenants_file: Path, tmp_path: Path) -> Iterator[str]:
    proc, url = serve_gateway(nats_url, tmp_path, {"HOPS_TENANTS": str(tenants_file)})
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture
async def errors(nc: NATS) -> AsyncIterator[list[ev.ErrorRecord]]:
    """Every error record published while the test runs."""
    seen: list[ev.ErrorRecord] = []

    async def on(msg: Msg) -> None:
        seen.append(msgspec.json.decode(msg.data, type=ev.ErrorRecord))

    sub = await nc.subscribe(subjects.ERRORS, cb=on)
    await nc.flush()
    yield seen
    await sub.unsubscribe()


async def eventually(probe: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """``probe()`` (awaited when it is a coroutine) once it is true."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} never happened"
        await asyncio.sleep(0.1)


async def ready(api: httpx.AsyncClient) -> None:
    """Until the scheduler answers admission (a malformed body is then a 400)."""
    async def answered() -> bool:
        r = await api.post("/jobs", content=b"{", headers=ADMIN)
        return r.status_code == 400
    await eventually(answered, "admission")


def audited(errors: list[ev.ErrorRecord], code: str, endpoint: str, who: str) -> bool:
    return any(e.service == "gateway" and e.code == code and e.subject == endpoint
               and e.error.startswith(who) for e in errors)


async def test_without_a_valid_token_every_endpoint_but_healthz_is_401(
    gateway: str, errors: list[ev.ErrorRecord]
) -> None:
    async with httpx.AsyncClient(base_url=gateway, timeout=10) as api:
        assert (await api.get("/healthz")).status_code == 200
        for method, path in (("GET", "/jobs"), ("GET", "/jobs/x"), ("POST", "/jobs"),
                             ("DELETE", "/jobs/x"), ("GET", "/queue"), ("GET", "/cluster"),
                             ("DELETE", "/nodes/s")):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                r = await api.request(method, path, headers=headers, content=b"{}")
                assert r.status_code == 401, (method, path, r.text)
                body = r.json()
                assert (body["ok"], body["code"]) == (False, "unauthorized")
                assert "bearer token" in body["error"]
                assert r.headers["www-authenticate"].startswith("Bearer")
        await eventually(lambda: audited(errors, "unauthorized", "GET /jobs", "anonymous"),
                         "an audit record of the refusal")


async def test_tenants_see_and_cancel_only_their_own_jobs_and_admins_all(
    gateway: str, scheduler: subprocess.Popen[bytes], errors: list[ev.ErrorRecord]
) -> None:
    async with httpx.AsyncClient(base_url=gateway, timeout=10) as api:
        await ready(api)
        assert (await api.post("/jobs", json=spec_json("a1"), headers=ALICE)).status_code == 201
        r = await api.post("/jobs", json=spec_json("b1", tenant="bob"), headers=BOB)
        assert r.status_code == 201, r.text
        # the job's tenant comes from the token, never from the body
        r = await api.post("/jobs", json=spec_json("a2", tenant="bob"), headers=ALICE)
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
        assert "may not submit a job for tenant bob" in r.json()["error"]
        # an admin may submit for any tenant
        r = await api.post("/jobs", json=spec_json("a3", tenant="alice"), headers=ADMIN)
        assert r.status_code == 201, r.text

        async def listed(headers: dict[str, str], **params: str) -> set[str]:
            r = await api.get("/jobs", headers=headers, params=params)
            assert r.status_code == 200, r.text
            return {j["job_id"] for j in r.json()["jobs"]}

        await eventually(lambda: _all_listed(listed), "every record")
        assert await listed(ALICE) == {"a1", "a3"}
        assert await listed(BOB) == {"b1"}
        assert (await api.get("/jobs/a1", headers=ALICE)).json()["spec"]["tenant"] == "alice"
        r = await api.get("/jobs", headers=ALICE, params={"tenant": "bob"})
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")
        # each tenant's ids are its own: alice's b1 is no job, whatever bob has,
        # for reading and cancelling
        for method in ("GET", "DELETE"):
            r = await api.request(method, "/jobs/b1", headers=ALICE)
            assert (r.status_code, r.json()) == (404, {"ok": False, "code": "not_found",
                                                       "error": "no job 'b1'"}), r.text
        assert (await api.get("/jobs/b1", headers=BOB)).json()["phase"] != "cancelled"
        assert (await api.delete("/nodes/s0", headers=ALICE)).status_code == 403
        await _own_queue(api)
        # the admin sees and cancels everything, naming the tenant
        assert await listed(ADMIN) == {"a1", "a3", "b1"}
        r = await api.delete("/jobs/b1", headers=ADMIN)
        assert (r.status_code, r.json()["code"]) == (404, "not_found"), r.text  # default's b1
        r = await api.delete("/jobs/b1", headers=ADMIN, params={"tenant": "bob"})
        assert r.json() == {"ok": True, "job_id": "b1"}, r.text
        assert (await api.delete("/jobs/a1", headers=ALICE)).status_code == 200
    await eventually(lambda: audited(errors, "forbidden", "POST /jobs", "tenant-alice")
                     and audited(errors, "forbidden", "DELETE /nodes/s0", "tenant-alice"),
                     "audit records of the tenant's refusals")


async def _all_listed(listed: Callable[..., Any]) -> bool:
    return bool(await listed(ADMIN) == {"a1", "a3", "b1"})


async def _own_queue(api: httpx.AsyncClient) -> None:
    """Alice's queue view holds only her jobs once the leader has planned."""
    async def entries(headers: dict[str, str]) -> set[str]:
        r = await api.get("/queue", headers=headers)
        return {e["job_id"] for e in r.json().get("entries", [])} if r.status_code == 200 else set()

    # an admin's view names each job by its key (tenant/id), a tenant's by its id
    await eventually(lambda: _has(entries, ADMIN, {"alice/a1", "bob/b1"}), "a queue view")
    assert await entries(ALICE) <= {"a1", "a3"}
    r = await api.get("/cluster", headers=ALICE)
    assert r.status_code == 200 and r.json()["double_booked"] == []


async def _has(entries: Callable[..., Any], headers: dict[str, str], ids: set[str]) -> bool:
    return bool(ids <= await entries(headers))


async def test_a_command_from_a_tenant_without_run_commands_is_forbidden_at_admission(
    gateway: str, scheduler: subprocess.Popen[bytes], errors: list[ev.ErrorRecord]
) -> None:
    command = ["python", "-c", "print(open('/etc/passwd').read())"]
    async with httpx.AsyncClient(base_url=gateway, timeout=10) as api:
        await ready(api)
        r = await api.post("/jobs", json=spec_json("c1", command=command), headers=ALICE)
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
        assert "may not run commands" in r.json()["error"]
        assert (await api.get("/jobs/c1", headers=ADMIN)).status_code == 404
        r = await api.post("/jobs", json=spec_json("c2", command=command), headers=BOB)
        assert r.status_code == 201, r.text
        # an admin names the tenant; the tenant's rule holds for it too
        r = await api.post("/jobs", json=spec_json("c3", tenant="alice", command=command),
                           headers=ADMIN)
        assert r.status_code == 403, r.text
        r = await api.post("/jobs", json=spec_json("c4", command=command), headers=ADMIN)
        assert r.status_code == 403 and "'default' is not in the tenants file" in r.text
    await eventually(lambda: any(e.service == "scheduler" and e.code == "forbidden"
                                 and "may not run commands" in e.error for e in errors),
                     "the scheduler's audit record")


def test_the_openapi_schema_declares_the_bearer_scheme(tenants_file: Path) -> None:
    app = create_app(gateway_settings("nats://127.0.0.1:1"),
                     tenants=load_tenants(tenants_file.read_text()))
    schema = TestClient(app).get("/openapi.json").json()  # no lifespan: no NATS needed
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": schema["components"][
            "securitySchemes"]["bearer"]["description"]}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path == "/healthz":
                assert "security" not in operation
                continue
            assert operation["security"] == [{"bearer": []}], (method, path)
            assert {"401", "403"} <= set(operation["responses"]), (method, path)


def test_the_gateway_refuses_to_start_without_tenants_unless_insecure(
    nats_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "HOPS_NATS_URL": nats_url}
    env.pop("HOPS_TENANTS", None)
    env.pop("HOPS_GATEWAY_INSECURE", None)
    done = subprocess.run([sys.executable, "-m", "gateway"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "no tenants file" in done.stderr, done.stderr
    assert "--insecure" in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: {a: {tokens: [x]}}\nadmins: {b: {tokens: [x]}}\n")
    done = subprocess.run([sys.executable, "-m", "gateway", "--tenants", str(bad)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and str(bad) in done.stderr, done.stderr
    proc, url = serve_gateway(nats_url, tmp_path, {"HOPS_GATEWAY_INSECURE": "1"})
    try:
        assert httpx.get(f"{url}/jobs", timeout=5).status_code == 200
    finally:
        stop(proc)
    assert "gateway is insecure" in next(tmp_path.glob("gateway-*.log")).read_text()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_the_gateway_serves_https_from_given_certificate_files(
    nats_url: str, tenants_file: Path, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    env = {"HOPS_TENANTS": str(tenants_file), "HOPS_GATEWAY_CERT": str(cert),
           "HOPS_GATEWAY_KEY": str(key)}
    trusted = ssl.create_default_context(cafile=str(cert))
    proc, url = serve_gateway(nats_url, tmp_path, env, scheme="https", verify=trusted)
    try:
        r = httpx.get(f"{url}/jobs", headers=ALICE, verify=trusted, timeout=5)
        assert r.status_code == 200 and r.json()["jobs"] == []
        with pytest.raises(httpx.TransportError):  # an unknown certificate is refused
            httpx.get(f"{url}/healthz", timeout=5)
        with pytest.raises(httpx.TransportError):  # no plain HTTP on the port
            httpx.get(url.replace("https", "http") + "/healthz", timeout=5)
    finally:
        stop(proc)


def hops(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(hops_app, list(args), env=env or {})


def test_the_cli_sends_its_token_and_says_401_clearly(
    gateway: str, tmp_path: Path
) -> None:
    plain = {"HOPS_GATEWAY_URL": gateway, "HOPS_CONFIG": "", "HOPS_TOKEN": ""}
    refused = hops("jobs", "--config", str(_config(tmp_path, gateway, "")), env=plain)
    assert refused.exit_code == 1
    assert "401 unauthorized" in refused.output and "bearer token" in refused.output
    for args, env in ((["--token", "alice-token"], plain),
                      ([], {**plain, "HOPS_TOKEN": "alice-token"}),
                      (["--config", str(_config(tmp_path, gateway, "alice-token"))], {}),
                      ([], {"HOPS_CONFIG": str(_config(tmp_path, gateway, "alice-token"))})):
        done = hops("jobs", "--json", *args, env=env)
        assert done.exit_code == 0, (args, env, done.output)
        assert json.loads(done.output)["jobs"] == []
    # the flag wins over the environment and the config file
    done = hops("jobs", "--token", "nope", env={**plain, "HOPS_TOKEN": "alice-token"})
    assert done.exit_code == 1 and "401" in done.output
    removal = hops("nodes", "remove", "s0", "--token", "alice-token", env=plain)
    assert removal.exit_code == 1 and "403 forbidden" in removal.output
    assert "admins" in removal.output


def _config(tmp_path: Path, gateway: str, token: str) -> Path:
    path = tmp_path / f"cli-{token or 'none'}.yaml"
    path.write_text(json.dumps({"gateway": gateway, "token": token}))
    return path
