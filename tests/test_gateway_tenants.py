"""``GET /tenants`` and ``hops tenants``: each tenant's virtual cluster as the
scheduler leader wrote it (KV ``hops_tenants``), over real HTTP. A gateway
and a scheduler process share a tenants file with cells on a real
nats-server; an admin sees every tenant, a tenant only its own (another's
is a 403), and a cluster without cells answers 404. The access rules are
also checked as pure functions (:mod:`gateway.access`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import access
from shared.tenants import Principal
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import nc, spec_json

# ``scheduler`` runs with this module's own ``tenants_file`` (fixtures resolve by name).
from tests.test_gateway_auth import (
    eventually,
    hops,
    ready,
    scheduler,
    serve_gateway,
    start,
    stop,
)

__all__ = ["nats_server", "nats_url", "nc", "scheduler"]  # fixtures

TENANTS_YAML = """\
tenants:
  alice: {tokens: ["alice-token"]}
  bob: {tokens: ["bob-token"]}
admins:
  ops: {tokens: ["admin-token"]}
cells:
  cell_types:
    A-PAIR: {child_cell_type: A, child_cell_number: 2}
    A-NODE: {child_cell_type: A-PAIR, child_cell_number: 2, is_node_level: true}
  physical_cells:
    - {cell_type: A-NODE, server: a0}
    - {cell_type: A-NODE, server: a1}
  virtual_clusters:
    alice: {virtual_cells: [{cell_type: A-NODE}]}
    bob: {virtual_cells: [{cell_type: A-PAIR, cell_number: 2}]}
"""
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
ADMIN = {"Authorization": "Bearer admin-token"}


def record(tenant: str) -> dict[str, Any]:
    return {"view": {"tenant": tenant}, "term": 1}


def test_an_admin_sees_every_tenant_and_a_tenant_only_its_own() -> None:
    admin, alice = Principal("ops", admin=True), Principal("alice", tenant="alice")
    records = [record("bob"), record("alice")]
    assert access.tenants_scope(admin, None) is None
    assert access.tenants_scope(admin, "bob") == "bob"
    assert access.tenants_scope(alice, None) == "alice"
    assert access.tenants_scope(alice, "alice") == "alice"
    denied = access.tenants_scope(alice, "bob")
    assert isinstance(denied, access.Denied) and (denied.status, denied.code) == (403, "forbidden")
    assert "alice may see only its own virtual cluster" in denied.error
    assert access.tenants_body(records, None) == {"tenants": [record("alice"), record("bob")]}
    assert access.tenants_body(records, "alice") == {"tenants": [record("alice")]}
    assert access.tenants_body(records, "carol") == {"tenants": []}


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS_YAML)
    return path


@pytest.fixture
def gateway(nats_url: str, tenants_file: Path, tmp_path: Path) -> Iterator[str]:
    proc, url = serve_gateway(nats_url, tmp_path, {"HOPS_TENANTS": str(tenants_file)})
    try:
        yield url
    finally:
        stop(proc)


async def test_get_tenants_shows_each_tenant_its_own_virtual_cluster(
        gateway: str, scheduler: subprocess.Popen[bytes], tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=gateway, timeout=10) as api:
        async def both() -> list[dict[str, Any]] | None:
            r = await api.get("/tenants", headers=ADMIN)
            assert r.status_code == 200, r.text
            shown = r.json()["tenants"]
            return shown if len(shown) == 2 else None

        shown = await eventually(both, "the leader's tenant views")
        assert [r["view"]["tenant"] for r in shown] == ["alice", "bob"]
        alice = shown[0]
        assert alice["term"] >= 1 and alice["leader"]
        (chain,) = alice["view"]["chains"]
        assert (chain["gpu_type"], chain["reserved_gpus"], chain["used_gpus"]) == ("A", 4, 0)
        assert [(lv["cell_type"], lv["reserved"], lv["bound"]) for lv in chain["levels"]] == [
            ("A-NODE", 1, 0)]
        (bob_chain,) = shown[1]["view"]["chains"]
        assert [(lv["cell_type"], lv["reserved"]) for lv in bob_chain["levels"]] == [
            ("A-PAIR", 2)]

        r = await api.get("/tenants", headers=ALICE)
        assert r.status_code == 200 and r.json() == {"tenants": [alice]}
        r = await api.get("/tenants", headers=BOB, params={"tenant": "alice"})
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
        r = await api.get("/tenants", headers=ADMIN, params={"tenant": "bob"})
        assert [t["view"]["tenant"] for t in r.json()["tenants"]] == ["bob"]
        assert (await api.get("/tenants")).status_code == 401

    # the CLI's table, with the tenant's own token
    out = hops("tenants", "--gateway", gateway, "--token", "alice-token")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("leader ") and "term" in lines[0]
    assert lines[1].split()[:2] == ["tenant", "chain"]
    assert lines[2].split()[:4] == ["alice", "A", "0/1", "A-NODE"]
    assert len(lines) == 3  # bob's cells are not alice's to see
    as_json = hops("tenants", "--gateway", gateway, "--token", "admin-token", "--json")
    assert '"tenant": "bob"' in as_json.output


def test_a_cluster_without_cells_answers_404(nats_url: str, tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text(TENANTS_YAML.split("cells:")[0])
    proc, url = serve_gateway(nats_url, tmp_path, {"HOPS_TENANTS": str(path)})
    try:
        r = httpx.get(f"{url}/tenants", headers=ADMIN, timeout=10)
        assert (r.status_code, r.json()["code"]) == (404, "not_found")
        assert "no cells" in r.json()["error"]
    finally:
        stop(proc)


async def test_admission_refuses_with_422_a_job_no_cell_of_its_tenant_holds(
        nats_url: str, tenants_file: Path, gateway: str, tmp_path: Path) -> None:
    env = {"HOPS_NATS_URL": nats_url, "HOPS_HEALTH_PORT": "", "HOPS_TENANTS": str(tenants_file),
           "HOPS_POLICY": "hived:opportunistic=false"}
    proc = start(["-m", "services.scheduler"], env, tmp_path / "scheduler-hived.log")
    try:
        async with httpx.AsyncClient(base_url=gateway, timeout=10) as api:
            await ready(api)
            # bob's cells are two pairs: 2 GPUs fit, 4 on one type never do
            r = await api.post("/jobs", json=spec_json("b-small", requirements=[2]), headers=BOB)
            assert r.status_code == 201, r.text
            r = await api.post("/jobs", json=spec_json("b-big", requirements=[4, 8]), headers=BOB)
            assert (r.status_code, r.json()["code"]) == (422, "unschedulable"), r.text
            assert r.json()["error"] == (
                "job b-big can never run here: it needs at least 4 GPUs of one type, more than "
                "any cell of tenant bob holds (2 A-PAIR (2 A)), and the policy has "
                "opportunistic jobs off; ask for fewer GPUs or for larger cells")
            # alice's node holds 4
            r = await api.post("/jobs", json=spec_json("a-big", requirements=[4]), headers=ALICE)
            assert r.status_code == 201, r.text
    finally:
        stop(proc)
