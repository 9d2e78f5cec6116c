"""Ids per tenant on the real stack (nats-server, every service and an
emulated cluster, each its own process), through the gateway and the CLI:
two tenants submit the same id and both jobs run, each tenant sees only its
own, another tenant's job answers exactly as a missing one, a tenant naming
another tenant is refused (403, whether or not the job exists), and an
admin inspects and cancels a job by naming its tenant (shared/jobkeys.py)."""

from __future__ import annotations

import httpx

from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until
from tests.test_live_holds import ALICE, BOB, NEVER, api, hops, stack

# fixtures: this module gets a stack of its own (module scope), like
# tests/test_live_holds.py's: one 4-GPU server, tenants alice and bob
__all__ = ["api", "stack"]


def answer(r: httpx.Response, job_id: str) -> tuple[int, str]:
    """Status and body, the job id in the body written as ``ID``."""
    return r.status_code, r.text.replace(job_id, "ID")


def test_two_tenants_run_one_id_and_each_sees_only_its_own(
    stack: LiveStack, api: httpx.Client
) -> None:
    for who in (ALICE, BOB):
        r = api.post("/jobs", json=catalog_spec("train", NEVER, requirements=[1]), headers=who)
        assert (r.status_code, r.json()) == (201, {"ok": True, "job_id": "train"}), r.text
        assert r.headers["location"] == "/jobs/train"
    # The very spec again is the same submission, answered as accepted (a
    # client retrying after a lost reply); another spec under the id is refused.
    r = api.post("/jobs", json=catalog_spec("train", NEVER, requirements=[1]), headers=ALICE)
    assert (r.status_code, r.json()) == (201, {"ok": True, "job_id": "train"}), r.text
    r = api.post("/jobs", json=catalog_spec("train", NEVER + 1, requirements=[1]),
                 headers=ALICE)
    assert r.status_code == 409 and "job train exists already" in r.json()["error"], r.text
    # inside, each is its own job under its key: its record, plan and process
    until(lambda: {stack.phase("alice/train"), stack.phase("bob/train")} == {"running"},
          "both jobs running", 90, stack.logs)
    assert stack.record("train") is None  # the default tenant has none
    assert stack.job_pids("alice/train") and stack.job_pids("bob/train")
    for who, tenant in ((ALICE, "alice"), (BOB, "bob")):
        mine = api.get("/jobs/train", headers=who).json()
        assert (mine["job_id"], mine["spec"]["id"], mine["spec"]["tenant"]) == (
            "train", "train", tenant), mine
        listed = api.get("/jobs", headers=who).json()["jobs"]
        assert [(j["job_id"], j["spec"]["tenant"]) for j in listed] == [("train", tenant)]
        gpus = [g["job_id"] for s in api.get("/cluster", headers=who).json()["servers"]
                for g in s["gpu_slots"] if g["job_id"]]
        assert sorted(gpus) == ["(another tenant)", "train"], gpus
    shown = hops(stack, "jobs", token="bob-token").output
    assert "train" in shown and "alice" not in shown, shown
    admin_gpus = {g["job_id"] for s in api.get("/cluster", headers=stack.headers).json()[
        "servers"] for g in s["gpu_slots"] if g["job_id"]}
    assert admin_gpus == {"alice/train", "bob/train"}


def test_another_tenants_job_answers_as_a_missing_one(
    stack: LiveStack, api: httpx.Client
) -> None:
    r = api.post("/jobs", json=catalog_spec("only-a", NEVER, requirements=[1]), headers=ALICE)
    assert r.status_code == 201, r.text
    until(lambda: stack.record("alice/only-a"), "only-a stored", 15, stack.logs)
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/hold"), ("POST", "/release")):
        theirs = api.request(method, f"/jobs/only-a{path}", headers=BOB)
        ghost = api.request(method, f"/jobs/ghost{path}", headers=BOB)
        assert theirs.status_code == 404, theirs.text
        assert answer(theirs, "only-a") == answer(ghost, "ghost"), (method, path)
    got = hops(stack, "cancel", "only-a", token="bob-token")
    missing = hops(stack, "cancel", "ghost", token="bob-token")
    assert got.exit_code == missing.exit_code == 1
    assert got.output.replace("only-a", "ID") == missing.output.replace("ghost", "ID")
    # naming another tenant is refused whether or not the job exists
    for job_id in ("only-a", "ghost"):
        r = api.get(f"/jobs/{job_id}", headers=BOB, params={"tenant": "alice"})
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
    refused = hops(stack, "job", "alice/only-a", token="bob-token")
    assert refused.exit_code == 1 and "403" in refused.output, refused.output
    assert stack.phase("alice/only-a") not in ("", "cancelled")


def test_an_admin_names_the_tenant_and_a_tenant_its_bare_id(
    stack: LiveStack, api: httpx.Client
) -> None:
    admin = stack.admin_token
    r = api.get("/jobs/train", headers=stack.headers, params={"tenant": "bob"})
    assert r.status_code == 200 and r.json()["spec"]["tenant"] == "bob", r.text
    # a bare id names the default tenant's job for an admin: there is none
    assert api.get("/jobs/train", headers=stack.headers).status_code == 404
    shown = hops(stack, "job", "bob/train", token=admin)
    assert shown.exit_code == 0 and "bob" in shown.output, shown.output
    bad = hops(stack, "job", "bob/train", "--tenant", "alice", token=admin)
    assert bad.exit_code == 2 and "names tenant bob" in bad.output, bad.output
    cancelled = hops(stack, "cancel", "train", "--tenant", "bob", token=admin)
    assert cancelled.output.strip() == "train: cancelled", cancelled.output
    until(lambda: stack.phase("bob/train") == "cancelled", "bob's train cancelled", 30,
          stack.logs)
    assert stack.phase("alice/train") == "running"  # the same id, another job
    mine = hops(stack, "cancel", "train", token="alice-token")
    assert mine.output.strip() == "train: cancelled", mine.output
    everything = hops(stack, "cancel", "--all", "--yes", token=admin)
    assert everything.exit_code == 0, everything.output
    until(lambda: {stack.phase("alice/train"), stack.phase("alice/only-a")} == {"cancelled"},
          "every job cancelled", 30, stack.logs)
