"""Reloading the tenants file on the real stack (nats-server, every service
and an emulated cluster, each its own OS process; docs/tenancy.md): a
reload that drops a tenant holds its waiting job with the reason
``unknown_tenant`` naming it, out of every plan, and one that names it
again lets the job run; a file that does not validate is refused by every
process and changes nothing; a kill -9 of the leader after a reload loses
no job, and the replica started again reads the file as it is then."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.up.credentials import effective_tenants
from shared.jobkeys import job_key
from shared.tenants import load_tenants
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until

CLUSTER = """\
name: reload
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
"""
BOTH = """\
tenants:
  alice: {tokens: ["alice-token"]}
  bob: {tokens: ["bob-token"]}
"""
ALICE_ONLY = """\
tenants:
  alice: {tokens: ["alice-token"]}
"""
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
NEVER = 10**13  # samples: a job that runs until something stops it
WAITING = ("submitted", "profiling", "queued")
PROCESSES = {("gateway", True), ("scheduler", True)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    root = tmp_path_factory.mktemp("reload")
    tenants = root / "tenants.yaml"
    tenants.write_text(BOTH)
    with LiveStack(root / "stack", CLUSTER, tenants=tenants) as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=20) as client:
        yield client


def hops(stack: LiveStack, *args: str, token: str) -> Any:
    env = {"HOPS_GATEWAY_URL": stack.config.gateway_url, "HOPS_TOKEN": token}
    return CliRunner().invoke(app, list(args), env=env)


def operator_writes(stack: LiveStack, text: str) -> None:
    """The operator's file as ``hops up`` makes it effective (the admin added)."""
    effective_tenants(stack.config.credentials_dir, load_tenants(text))


def reload(stack: LiveStack, api: httpx.Client) -> dict[str, Any]:
    """``POST /tenants/reload`` as admin; every process reloaded."""
    r = api.post("/tenants/reload", headers=stack.headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert {(a["service"], a["ok"]) for a in body["answers"]} == PROCESSES, body
    assert len(body["answers"]) == 1 + stack.schedulers, body
    return body


def every_process_reloads(stack: LiveStack, api: httpx.Client) -> bool:
    r = api.post("/tenants/reload", headers=stack.headers)
    return r.status_code == 200 and len(r.json()["answers"]) == 1 + stack.schedulers


def A(job_id: str) -> str:
    """The key of alice's job (shared/jobkeys.py): its record's, its plans'."""
    return job_key("alice", job_id)


def B(job_id: str) -> str:
    return job_key("bob", job_id)


def submit(api: httpx.Client, job_id: str, who: dict[str, str]) -> None:
    r = api.post("/jobs", json=catalog_spec(job_id, NEVER, requirements=[4]), headers=who)
    assert r.status_code == 201, r.text


def hog(stack: LiveStack, api: httpx.Client, job_id: str) -> None:
    """An alice job on every GPU, so that what is submitted next waits."""
    submit(api, job_id, ALICE)
    until(lambda: stack.phase(A(job_id)) == "running", f"{job_id} runs", 60, stack.logs)


def assigned(stack: LiveStack, job_id: str, since: float = 0.0) -> bool:
    return any(a["job_id"] == job_id
               for p in stack.bus_().messages("hops.v1.plans", "plan_issued", since)
               for a in p.body["plan"]["assignments"])


def stranded(stack: LiveStack, job_id: str) -> bool:
    reason = str((stack.record(job_id) or {}).get("reason", ""))
    return reason.startswith("unknown_tenant:") and "'bob'" in reason


def test_dropping_a_tenant_holds_its_waiting_job_and_naming_it_again_runs_it(
    stack: LiveStack, api: httpx.Client
) -> None:
    hog(stack, api, "hog-1")
    submit(api, "bob-1", BOB)
    until(lambda: stack.phase(B("bob-1")) in WAITING, "bob-1 waits", 30, stack.logs)
    operator_writes(stack, ALICE_ONLY)
    body = reload(stack, api)
    assert all(a["tenants"] == ["alice"] for a in body["answers"]), body
    until(lambda: stranded(stack, B("bob-1")), "bob-1 held as of an unknown tenant", 30,
          stack.logs)
    shown = api.get("/jobs/bob-1", headers=stack.headers, params={"tenant": "bob"}).json()
    assert shown["reason"].startswith("unknown_tenant: tenant 'bob' is not in the tenants file")
    table = hops(stack, "jobs", token=stack.admin_token)
    assert table.exit_code == 0, table.output
    (row,) = [line for line in table.output.splitlines() if line.startswith("bob-1 ")]
    assert "unknown_tenant" in row, table.output
    assert api.get("/jobs", headers=BOB).status_code == 401  # bob's token is gone
    # The GPUs free up; bob-1 is still in no plan.
    assert api.delete("/jobs/hog-1", headers=ALICE).status_code == 200
    stack.wait_final([A("hog-1")], 60)
    freed = time.monotonic()
    time.sleep(3 * stack.round_s)
    assert not assigned(stack, B("bob-1"), freed) and stack.phase(B("bob-1")) in WAITING
    assert stranded(stack, B("bob-1"))
    # Named again (through the CLI): released, planned, running.
    operator_writes(stack, BOTH)
    out = hops(stack, "tenants", "reload", token=stack.admin_token)
    assert out.exit_code == 0, out.output
    assert [line.split()[0] for line in out.output.splitlines()].count("scheduler") == 2
    until(lambda: stack.phase(B("bob-1")) == "running", "bob-1 runs once bob is back", 60,
          stack.logs)
    assert not str((stack.record(B("bob-1")) or {}).get("reason", "")).startswith("unknown_tenant")
    assert api.delete("/jobs/bob-1", headers=BOB).status_code == 200
    stack.wait_final([B("bob-1")], 60)


def test_a_file_that_does_not_validate_is_refused_everywhere_and_changes_nothing(
    stack: LiveStack, api: httpx.Client
) -> None:
    effective = stack.config.credentials_dir / "tenants.yaml"
    good = effective.read_text()
    try:
        effective.write_text("tenants: {alice: {tokens: [alice-token]\n")  # unclosed
        r = api.post("/tenants/reload", headers=stack.headers)
        assert (r.status_code, r.json()["code"]) == (422, "invalid"), r.text
        answers = r.json()["answers"]
        assert len(answers) == 1 + stack.schedulers and not any(a["ok"] for a in answers)
        assert all(a["tenants"] == ["alice", "bob"] for a in answers), answers  # kept
        assert str(effective) in r.json()["error"], r.text
        # Two tenants with one token, and bob dropped: refused by the CLI, exit 1.
        effective.write_text("tenants:\n  alice: {tokens: [alice-token]}\n"
                             "  carol: {tokens: [alice-token]}\n")
        out = hops(stack, "tenants", "reload", token=stack.admin_token)
        assert out.exit_code == 1, out.output
        assert "refused (invalid)" in out.output and "token" in out.output, out.output
        assert "keeps tenants: alice, bob" in out.output, out.output
        # Nothing changed: alice and bob submit with their tokens, as before.
        submit(api, "alice-2", ALICE)
        submit(api, "bob-2", BOB)
        assert stack.record(B("bob-2")) is not None
        assert api.post("/tenants/reload", headers=ALICE).status_code == 403  # admins only
    finally:
        effective.write_text(good)
    reload(stack, api)
    for job, tenant in (("alice-2", "alice"), ("bob-2", "bob")):
        r = api.delete(f"/jobs/{job}", headers=stack.headers, params={"tenant": tenant})
        assert r.status_code == 200, r.text
    stack.wait_final([A("alice-2"), B("bob-2")], 60)
    assert not stranded(stack, B("bob-2"))


def test_a_kill_of_the_leader_after_a_reload_loses_nothing(
    stack: LiveStack, api: httpx.Client
) -> None:
    hog(stack, api, "hog-3")
    submit(api, "bob-3", BOB)
    submit(api, "alice-3", ALICE)
    until(lambda: stack.phase(B("bob-3")) in WAITING, "bob-3 waits", 30, stack.logs)
    before = set(stack.bus_().bucket("hops_jobs"))
    operator_writes(stack, ALICE_ONLY)
    reload(stack, api)
    lease = stack.leader()
    assert lease is not None
    killed = lease["holder"]
    stack.kill(killed)  # kill -9, right after the reload answered
    until(lambda: (x := stack.leader()) and x["holder"] != killed, "a new leader", 20,
          stack.logs)
    until(lambda: stranded(stack, B("bob-3")), "bob-3 held by the new leader", 30, stack.logs)
    assert set(stack.bus_().bucket("hops_jobs")) >= before  # every job is still there
    # The killed replica starts again and reads the file as it is now (no bob):
    # once it leads, bob-3 stays held.
    stack.procs[killed] = stack.launcher.start(stack.procs[killed].component)
    until(lambda: stack.healthy(killed), f"{killed} back", 30, stack.logs)
    other = next(n for n in stack.health if n.startswith("scheduler-") and n != killed)
    stack.kill(other)
    until(lambda: (x := stack.leader()) and x["holder"] == killed, f"{killed} leads", 20,
          stack.logs)
    assert api.delete("/jobs/hog-3", headers=ALICE).status_code == 200
    stack.wait_final([A("hog-3")], 60)
    until(lambda: stack.phase(A("alice-3")) == "running", "alice-3 runs", 60, stack.logs)
    assert stranded(stack, B("bob-3")) and stack.phase(B("bob-3")) in WAITING
    assert set(stack.bus_().bucket("hops_jobs")) >= before
    stack.procs[other] = stack.launcher.start(stack.procs[other].component)
    operator_writes(stack, BOTH)
    # A replica answers reloads once it serves admission, a moment after its
    # health endpoint: until then it would read the file at its start anyway.
    until(lambda: every_process_reloads(stack, api), f"{other} back and reloading", 30,
          stack.logs)
    assert api.delete("/jobs/alice-3", headers=ALICE).status_code == 200
    until(lambda: stack.phase(B("bob-3")) == "running", "bob-3 runs once bob is back", 60,
          stack.logs)
    assert api.delete("/jobs/bob-3", headers=BOB).status_code == 200
