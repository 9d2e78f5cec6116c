"""HiveD in the live system (issue 20, "Live system"), end to end.

One stack (:mod:`tests.livestack`: nats-server, every service, two
scheduler replicas planning with the ``hived`` policy, and an EMULATED
cluster of two 4-GPU nodes in cells and a 1-GPU server for profiling, each
its own OS process, as ``hops up --tenants FILE --policy hived`` runs them)
with two tenants whose tokens and cells come from one tenants file: alice
reserves one node, bob is low-priority (his jobs only run
opportunistically, §3.3). In order:

1. bob runs two 4-GPU jobs on the idle nodes; alice's job then needs a
   node, and one of bob's jobs is preempted through the placer: stopped
   before alice's job starts there, requeued with its progress kept, while
   the other runs on;
2. the leader is killed: the standby takes the lease, rebuilds the same
   bindings from the object store ``hops_state`` (object ``layer.hived``,
   §4 "Fault tolerance"), and each tenant's ``GET /tenants`` shows the
   same view, written in the new term, and its forecasts go on from the old
   leader's calibration (object ``forecast.calibration``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.access import view_by_id
from shared import subjects
from shared.explain import CALIBRATION_KEY
from shared.jobkeys import job_key, local_id
from tests.helpers import catalog_spec, timeline_of
from tests.livestack import LiveStack, until

CLUSTER = """\
name: hived
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-p, gpu_type: RTX3090, gpus: 1}
"""
# rtx-p is in no cell: a job is profiled before it is planned (Hops §3.2),
# and with every GPU of the cells busy alice's job could not be profiled, so
# it would never ask for its cell (see docs/tenancy.md, "The live system").
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
    bob: {low_priority: true}
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


# The jobs by their keys (shared/jobkeys.py), as records, events and an
# admin's views name them.
B1, B2, A1 = job_key("bob", "b-1"), job_key("bob", "b-2"), job_key("alice", "a-1")


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


def explain_state(bus: Any) -> dict[str, Any]:
    """Each job's reason code, receipt and position in ``hops_explain``."""
    return {k: ((e.get("why") or {}).get("code"), e.get("receipt"),
                (e.get("forecast") or {}).get("position"))
            for k, e in bus.bucket(subjects.KV_EXPLAIN).items() if not k.startswith("_")}


def steady(bus: Any) -> dict[str, Any] | None:
    """``explain_state`` once two reads a moment apart agree (the leader
    writes a plan's entries together, its forecast's a little later)."""
    before = explain_state(bus)
    time.sleep(1.0)
    return before if explain_state(bus) == before else None


def carried_on(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether the calibration state ``new`` continues ``old``: the same
    residuals first, and each job still open has its newest old forecast
    open (a job the new leader saw start or finish has none)."""
    cal, was = new["calibration"], old["calibration"]
    if any(cal[q][:len(was[q])] != was[q] for q in ("start", "finish")):
        return False
    return all(opens[-1] in new[kind][job] for kind in ("open_start", "open_finish")
               for job, opens in old[kind].items() if job in new[kind])


def queue_state(bus: Any) -> list[tuple[str, str | None, int]]:
    """The queue as ``hops.v1.queue`` answers it: each job, its reason code
    and its position."""
    view = bus.request(subjects.QUEUE, b"{}")
    assert view["ok"], view
    return [(e["job_id"], (e.get("why") or {}).get("code"), e.get("position", 0))
            for e in view["entries"]]


def test_a_guaranteed_job_preempts_an_opportunistic_one_through_the_placer(
        stack: LiveStack, api: httpx.Client) -> None:
    for job_id in (B1, B2):
        r = api.post("/jobs", json=spec(local_id(job_id)), headers=BOB)
        assert r.status_code == 201, r.text
    until(lambda: running_on(stack, B1) and running_on(stack, B2), "bob's jobs running",
          90, stack.logs)
    assert running_on(stack, B1) != running_on(stack, B2)

    def bob_running() -> dict[str, Any] | None:
        bob = views(api, admin(stack)).get("bob")
        view = bob["view"] if bob else None
        return view if view and view["opportunistic_jobs"] == [B1, B2] else None

    bob = until(bob_running, "bob's jobs opportunistic in his view", 30, stack.logs)
    assert bob["low_priority"] and bob["opportunistic_gpus"] == 8 and not bob["chains"]
    for job_id in (B1, B2):
        until(lambda j=job_id: (stack.record(j) or {}).get("samples_done", 0) > 0,  # type: ignore[misc]
              f"{job_id} progresses", 30, stack.logs)

    where = {j: running_on(stack, j) for j in (B1, B2)}
    r = api.post("/jobs", json=spec("a-1"), headers=ALICE)
    assert r.status_code == 201, r.text
    until(lambda: running_on(stack, A1), "alice's job running", 90, stack.logs)
    bus = stack.bus_()
    stopped = {j: bus.job_events(j, "job_stopped") for j in (B1, B2)}
    (victim,) = [j for j, events in stopped.items() if events]
    (survivor,) = {B1, B2} - {victim}
    event = stopped[victim][0]
    assert event.body["reason"] == "not in the plan", event.body
    kept = event.body["samples_done"]
    assert kept is not None and kept > 0
    started = bus.job_events(A1, "job_started")
    assert started and event.at < started[0].at  # stop before start,
    assert running_on(stack, A1) == where[victim]  # on the GPUs the victim held
    rec = stack.record(victim)
    assert rec is not None and rec["phase"] == "queued", rec
    assert rec["samples_done"] >= kept  # requeued with its progress
    assert running_on(stack, survivor) is not None
    # its stop is on its timeline, with the receipt naming the reclaim
    stops = until(lambda: [e for e in timeline_of(bus.stored, victim) if e["kind"] == "stopped"],
                  "the victim's stop on its timeline", 15, stack.logs)
    receipt = stops[0]["receipt"]
    assert receipt is not None and receipt["rule"] == "CellReclaim", stops
    assert A1 in receipt["takers"], receipt
    explained = bus.get(subjects.KV_EXPLAIN, victim)
    assert explained is not None and explained["receipt"]["rule"] == "CellReclaim"

    def settled() -> dict[str, dict[str, Any]] | None:
        shown = views(api, admin(stack))
        a, b = shown["alice"]["view"], shown["bob"]["view"]
        ok = a["guaranteed_jobs"] == [A1] and b["opportunistic_jobs"] == [survivor]
        return shown if ok else None

    shown = until(settled, "the views after the preemption", 30, stack.logs)
    (chain,) = shown["alice"]["view"]["chains"]
    (cell,) = chain["bound"]
    assert {s["server"] for s in cell["servers"]} == running_on(stack, A1)
    assert (chain["used_gpus"], chain["free_gpus"]) == (4, 0)
    assert shown["bob"]["view"]["opportunistic_gpus"] == 4
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
    bus = stack.bus_()
    # a round's first plan after the reclaim: the reasons the old leader
    # leaves are those of a steady state, which the new one plans again
    # (the reclaim's own reason, TenantCells, holds for one plan only)
    first = max(p["round"] for p in bus.plans())
    until(lambda: any(p["round"] > first and p["first_plan"] for p in stack.bus_().plans()),
          "a first plan after the reclaim", 30, stack.logs)
    explained = until(lambda: steady(bus), "hops_explain settled", 10, stack.logs)
    queued = queue_state(bus)
    history = {j: timeline_of(bus.stored, j) for j in (A1, B1, B2)}
    assert all(history.values()), history
    stack.kill(leader)
    # the forecasts' calibration as the old leader last wrote it (it writes
    # no more): its open forecasts, e.g. of the requeued victim's start
    calibration = bus.state(CALIBRATION_KEY)
    assert calibration is not None and (
        calibration["open_start"] or calibration["open_finish"]), calibration

    def new_term() -> int | None:
        lease = stack.leader()
        return lease["term"] if lease and lease["holder"] != leader and lease["term"] else None

    assert until(new_term, "a new leader", 20, stack.logs) > term
    for headers, tenant in ((ALICE, "alice"), (BOB, "bob")):
        record = until(lambda h=headers, t=tenant: (  # type: ignore[misc]
            views(api, h)[t] if views(api, h)[t]["term"] > term else None),
            f"{tenant}'s view in the new term", 20, stack.logs)
        # a tenant's view names its jobs by their ids, an admin's by their keys
        assert record["view"] == view_by_id(before[tenant]), tenant
    # the new leader's own plans keep the bindings (the layer restored them)
    until(lambda: any(p["term"] > term for p in stack.bus_().plans()),
          "a plan of the new term", 20, stack.logs)
    after = {t: r["view"] for t, r in views(api, admin(stack)).items()}
    assert after == before
    # the reasons, receipts and positions, in hops_explain and in the queue,
    # are the old leader's (read from the bucket, and the same snapshot)
    assert explain_state(bus) == explained
    assert queue_state(bus) == queued
    # and every job's timeline is whole: kill -9 lost none of it
    for job_id, entries in history.items():
        assert timeline_of(bus.stored, job_id)[:len(entries)] == entries, job_id
    # nothing that ran was stopped or moved by the new leader's plans
    (survivor,) = before["bob"]["opportunistic_jobs"]
    for job_id in (A1, survivor):
        assert running_on(stack, job_id) is not None
        assert not stack.bus_().job_events(job_id, "job_stopped"), job_id
    # the bindings the new leader restored are the object the old one wrote
    assert stack.bus_().state("layer.hived") is not None
    # the new leader loaded the calibration and goes on from it: its first
    # write holds every old residual and each job's newest open forecast
    moved = until(lambda: (lambda c: c if c != calibration else None)(
        bus.state(CALIBRATION_KEY)),
        "the new leader's calibration", 20, stack.logs)
    assert calibration is not None and carried_on(calibration, moved), (calibration, moved)

