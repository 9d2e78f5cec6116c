"""Profiles reused on the real stack (nats-server, every service and an
emulated cluster of two GPU types, each its own process): the second job of
a profile signature gets no profiling run, is queued with both types in its
``profiled`` list and runs; a job of another signature is profiled. An
operator's reprofile (``hops signatures reprofile``) has the next job of the
signature profiled again on the types named; a tenant is refused (403, exit
1) and an unknown signature is a 404, and neither changes anything."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from shared.jobkeys import job_key
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until
from tests.test_live_hardening import hops

CLUSTER = """\
name: reuse
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""
TYPES = ["RTX3090", "TitanXP"]
SHORT = 10_000_000  # a second or two of wall time at x600
TENANTS = """\
tenants:
  alice: {tokens: ["alice-token"]}
"""
ALICE = {"Authorization": "Bearer alice-token"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    root = tmp_path_factory.mktemp("reuse")
    tenants = root / "tenants.yaml"
    tenants.write_text(TENANTS)
    with LiveStack(root / "stack", CLUSTER, tenants=tenants) as s:
        yield s


def submit(stack: LiveStack, job_id: str, model: str = "resnet18-cifar10") -> None:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10) as api:
        spec = {**catalog_spec(job_id, SHORT, model, requirements=[1]), "tenant": "alice"}
        r = api.post("/jobs", json=spec, headers=stack.headers)
    assert r.status_code == 201, r.text


def profiled_by_plans(stack: LiveStack, job_id: str) -> set[str]:
    key = job_key("alice", job_id)  # inside the system, alice's jobs go by their key
    return {t["gpu_type"] for p in stack.bus_().plans() for t in p["plan"]["profiling"]
            if t["job_id"] == key}


def finished(stack: LiveStack, job_id: str) -> dict[str, Any] | None:
    rec = stack.record(job_key("alice", job_id))
    return rec if rec is not None and rec["phase"] == "finished" else None


def test_the_second_job_of_a_signature_is_not_profiled(stack: LiveStack) -> None:
    submit(stack, "first")
    until(lambda: finished(stack, "first"), "first finished", 60, stack.logs)
    assert profiled_by_plans(stack, "first") == set(TYPES)
    submit(stack, "second")
    rec = until(lambda: finished(stack, "second"), "second finished", 60, stack.logs)
    assert sorted(rec["profiled"]) == TYPES
    assert profiled_by_plans(stack, "second") == set()
    assert "profiles reused" in stack.logs(tail=10**7)


def test_a_job_of_another_signature_is_profiled(stack: LiveStack) -> None:
    submit(stack, "other", model="resnet50-cifar10")
    until(lambda: finished(stack, "other"), "other finished", 60, stack.logs)
    assert profiled_by_plans(stack, "other") == set(TYPES)


def signatures(stack: LiveStack) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{stack.config.gateway_url}/signatures", headers=stack.headers, timeout=10)
    assert r.status_code == 200, r.text
    return {s["signature"]: s for s in r.json()["signatures"]}


def test_reprofile_on_demand_profiles_the_next_job_of_the_signature(stack: LiveStack) -> None:
    code, out = hops(stack, "signatures", "--json")
    assert code == 0, out
    listed = signatures(stack)
    first = next(s for s in listed.values() if s["model"] == "resnet18-cifar10")
    assert (first["current"], first["stale"]) == (TYPES, [])
    code, out = hops(stack, "signatures", "reprofile", "--job", "alice/first", "--type", "RTX3090")
    assert code == 0 and "stale on RTX3090" in out, out
    now = signatures(stack)[first["signature"]]
    assert (now["current"], now["stale"]) == (["TitanXP"], ["RTX3090"])
    submit(stack, "third")
    rec = until(lambda: finished(stack, "third"), "third finished", 60, stack.logs)
    assert sorted(rec["profiled"]) == TYPES
    assert profiled_by_plans(stack, "third") == {"RTX3090"}  # TitanXP is reused
    again = signatures(stack)[first["signature"]]
    assert (again["current"], again["stale"]) == (TYPES, [])  # its report is current


def test_reprofile_is_for_admins_and_known_signatures(stack: LiveStack) -> None:
    before = signatures(stack)
    sig = next(iter(before))
    url = stack.config.gateway_url
    r = httpx.get(f"{url}/signatures", headers=ALICE, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = httpx.post(f"{url}/signatures/{sig}/reprofile", headers=ALICE, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    result = CliRunner().invoke(app, ["signatures", "reprofile", sig, "--gateway", url],
                                env={"HOPS_TOKEN": "alice-token"})
    assert result.exit_code == 1 and "403 forbidden" in result.output
    r = httpx.post(f"{url}/signatures/0123456789abcdef/reprofile", headers=stack.headers,
                   timeout=10)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    code, out = hops(stack, "signatures", "reprofile", "0123456789abcdef")
    assert code == 1 and "404 not_found" in out
    r = httpx.post(f"{url}/signatures/{sig}/reprofile", json={"gpu_types": ["K80"]},
                   headers=stack.headers, timeout=10)
    assert r.status_code == 422 and r.json()["code"] == "invalid"
    code, out = hops(stack, "signatures", "reprofile")
    assert code == 2
    assert signatures(stack) == before  # nothing changed
