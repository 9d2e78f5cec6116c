"""HiveD in the live system (issue 20, "Live system"), end to end.

One stack (:mod:`tests.livestack`: nats-server, every service, two
scheduler replicas planning with the ``hived`` policy, and a two-server
EMULATED cluster, each its own OS process, as ``hops up --tenants FILE
--policy hived`` runs them) with two tenants whose tokens and cells come
from one tenants file: alice and bob each reserve one node. In order:

1. bob runs two 4-GPU jobs: one in his own node (guaranteed) and one on
   alice's idle node (opportunistic, §3.3); alice's job then needs her node,
   and the opportunistic job is preempted through the placer: stopped
   before alice's job starts there, requeued with its progress kept;
2. the leader is killed: the standby takes the lease, rebuilds the same
   bindings from KV ``hops_layers`` (§4 "Fault tolerance"), and each
   tenant's ``GET /tenants`` shows the same view, written in the new term.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until

CLUSTER = """\
name: hived
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4}
"""
TENANTS = """\
tenants:
  alice: {tokens: ["alice-token"]}
  bob: {tokens: ["bob-token"]}
cells:
  cell_types:
    RTX-PAIR: {child_cell_type: RTX3090, child_cell_number: 2}
    RTX-NODE: {child_cell_type: RTX-PAIR, child_cell_number: 2, is_node_level: true}
  physical_cells:
    - {cell_type: RTX-NODE, server: rtx-0}
    - {cell_type: RTX-NODE, server: rtx-1}
  virtual_clusters:
    alice: {virtual_cells: [{cell_type: RTX-NODE}]}
    bob: {virtual_cells: [{cell_type: RTX-NODE}]}
"""
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
NEVER = 10**13  # samples: a job that runs until something stops it


def spec(job_id: str) -> dict[str, Any]:
    return catalog_spec(job_id, NEVER, requirements=[4])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    root = tmp_path_factory.mktemp("hived")
    tenants = root / "tenants.yaml"
    tenants.write_text(TENANTS)
    with LiveStack(root / "stack", CLUSTER, policy="hived", tenants=tenants) as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10) as client:
        yield client


def views(api: httpx.Client, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``GET /tenants`` as ``{tenant: record}``."""
    r = api.get("/tenants", headers=headers)
    assert r.status_code == 200, r.text
    return {t["view"]["tenant"]: t for t in r.json()["tenants"]}


def admin(stack: LiveStack) -> dict[str, str]:
    return stack.headers


def running_on(stack: LiveStack, job_id: str) -> set[str] | None:
    rec = stack.record(job_id) or {}
    if rec.get("phase") != "running":
        return None
    return {s for s, _ in (rec.get("configuration") or {}).get("parts", [])}


def test_a_guaranteed_job_preempts_an_opportunistic_one_through_the_placer(
        stack: LiveStack, api: httpx.Client) -> None:
    for job_id in ("b-1", "b-2"):
        r = api.post("/jobs", json=spec(job_id), headers=BOB)
        assert r.status_code == 201, r.text
    until(lambda: running_on(stack, "b-1") and running_on(stack, "b-2"), "bob's jobs running",
          90, stack.logs)

    def bob_split() -> dict[str, Any] | None:
        bob = views(api, admin(stack)).get("bob")
        view = bob["view"] if bob else None
        ok = view and len(view["guaranteed_jobs"]) == 1 and len(view["opportunistic_jobs"]) == 1
        return view if ok else None

    bob = until(bob_split, "one of bob's jobs opportunistic", 30, stack.logs)
    (own,), (opp,) = bob["guaranteed_jobs"], bob["opportunistic_jobs"]
    assert bob["opportunistic_gpus"] == 4
    opp_servers = running_on(stack, opp)
    assert opp_servers is not None and opp_servers.isdisjoint(running_on(stack, own) or set())
    until(lambda: (stack.record(opp) or {}).get("samples_done", 0) > 0, f"{opp} progresses",
          30, stack.logs)

    r = api.post("/jobs", json=spec("a-1"), headers=ALICE)
    assert r.status_code == 201, r.text
    until(lambda: running_on(stack, "a-1"), "alice's job running", 90, stack.logs)
    assert running_on(stack, "a-1") == opp_servers  # alice's node was the one bob borrowed

    bus = stack.bus_()
    stopped = [m for m in bus.job_events(opp, "job_stopped")]
    assert stopped and stopped[0].body["reason"] == "not in the plan", stopped
    kept = stopped[0].body["samples_done"]
    assert kept is not None and kept > 0
    started = [m for m in bus.job_events("a-1", "job_started")]
    assert started and stopped[0].at < started[0].at  # stop before start, on the same GPUs
    rec = stack.record(opp)
    assert rec is not None and rec["phase"] == "queued" and rec["samples_done"] >= kept
    assert rec["restarts"] >= 1 or rec["phase"] == "queued"

    def settled() -> dict[str, dict[str, Any]] | None:
        shown = views(api, admin(stack))
        a, b = shown["alice"]["view"], shown["bob"]["view"]
        ok = a["guaranteed_jobs"] == ["a-1"] and b["opportunistic_jobs"] == [] \
            and b["guaranteed_jobs"] == [own]
        return shown if ok else None

    shown = until(settled, "the views after the preemption", 30, stack.logs)
    (chain,) = shown["alice"]["view"]["chains"]
    (cell,) = chain["bound"]
    assert {s["server"] for s in cell["servers"]} == opp_servers
    assert chain["used_gpus"] == 4 and chain["free_gpus"] == 0
    # each tenant sees its own view only
    assert set(views(api, ALICE)) == {"alice"} and set(views(api, BOB)) == {"bob"}
    r = api.get("/tenants", headers=ALICE, params={"tenant": "bob"})
    assert r.status_code == 403


def test_each_tenant_sees_the_same_bindings_after_a_scheduler_failover(
        stack: LiveStack, api: httpx.Client) -> None:
    lease = stack.leader()
    assert lease is not None
    leader, term = lease["holder"], lease["term"]
    before = {t: r["view"] for t, r in views(api, admin(stack)).items()}
    assert before["alice"]["chains"][0]["bound"], before
    stack.kill(leader)

    def new_term() -> int | None:
        lease = stack.leader()
        return lease["term"] if lease and lease["holder"] != leader and lease["term"] else None

    assert until(new_term, "a new leader", 20, stack.logs) > term
    for headers, tenant in ((ALICE, "alice"), (BOB, "bob")):
        record = until(lambda h=headers, t=tenant: (  # type: ignore[misc]
            views(api, h)[t] if views(api, h)[t]["term"] > term else None),
            f"{tenant}'s view in the new term", 20, stack.logs)
        assert record["view"] == before[tenant], tenant
    # the new leader's own plans keep the bindings (the layer restored them)
    until(lambda: any(p["term"] > term for p in stack.bus_().plans()),
          "a plan of the new term", 20, stack.logs)
    after = {t: r["view"] for t, r in views(api, admin(stack)).items()}
    assert after == before
    assert running_on(stack, "a-1") is not None
