"""Every error of the gateway and of the ``hops`` commands reads as a sentence.

The gateway on a real nats-server (TestClient, lifespan included), a NATS
outage made by stopping that server, and the ``hops`` commands pointed at a
real HTTP server that is not a gateway.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from cli.main import app as hops_app
from gateway.app import create_app
from services.runtime.natsd import EmbeddedNats
from shared.events import MAX_PAYLOAD
from tests.helpers import free_port
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import client, gateway_settings

__all__ = ["client", "nats_server", "nats_url"]  # fixtures


def test_a_body_above_the_limit_is_refused_in_a_sentence(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:  # 20 MB, chunked: no Content-Length
        for _ in range(20):
            yield b" " * 1_000_000

    r = client.post("/jobs", content=chunks())
    assert r.status_code == 413
    assert r.json()["error"] == f"request body is larger than the limit of {MAX_PAYLOAD} bytes"
    r = client.post("/jobs", content=b" " * (MAX_PAYLOAD + 1))
    assert r.json()["error"] == (
        f"request body of {MAX_PAYLOAD + 1} bytes is larger than the limit of {MAX_PAYLOAD} bytes"
    )


def test_paths_and_methods_it_does_not_serve_get_its_error_shape(client: TestClient) -> None:
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.json() == {
        "ok": False, "code": "not_found",
        "error": "the gateway has no endpoint /nowhere (its endpoints are listed at /docs)",
    }
    r = client.put("/jobs")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    assert r.json()["error"] == "/jobs does not accept PUT (its methods are listed at /docs)"
    assert client.get("/jobs/nope").json()["error"] == "no job 'nope'"  # an endpoint's own 404


def test_a_nats_outage_reads_as_a_sentence(nats_server: EmbeddedNats) -> None:
    app = create_app(gateway_settings(nats_server.url, timeout=0.5), tenants=None)
    with TestClient(app) as c:
        assert c.get("/cluster").status_code == 200
        nats_server.stop()
        r = c.get("/cluster")
    assert r.status_code == 503 and r.json()["code"] == "unavailable"
    error = r.json()["error"]
    assert error.startswith("the gateway could not read from NATS (")
    assert error.endswith("); try again once NATS is back")


@pytest.fixture
def not_a_gateway(tmp_path: Path) -> Iterator[str]:
    """A plain HTTP file server: HTML error pages, no JSON."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "no HTTP server"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_commands_say_when_the_address_is_not_a_gateway(
    not_a_gateway: str, tmp_path: Path
) -> None:
    env = {"HOPS_GATEWAY_URL": not_a_gateway}
    listed = CliRunner().invoke(hops_app, ["jobs"], env=env)
    assert listed.exit_code == 1
    assert listed.output.strip() == (
        f"error: 404: {not_a_gateway}/jobs?limit=1000 answered with something a Hops gateway "
        "never sends; is it the gateway's address?"
    )
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("- {id: a, model: m, batch_size: 8, params: 10, total_samples: 100,"
                    " requirements: [1]}\n")
    sent = CliRunner().invoke(hops_app, ["submit", str(jobs)], env=env)
    assert sent.exit_code == 1 and "<" not in sent.output
    assert sent.output.startswith(f"a: rejected (501): {not_a_gateway}/jobs answered with")
