"""Hold, release and bulk cancel on the real stack (nats-server, every
service and an emulated cluster, each its own process), through the gateway
and the CLI, with two tenants: a held job is in no plan while others run, a
release plans it, a running job cannot be held (``not_pending``), a tenant
holds only its own jobs and learns nothing of another's, a hold outlives a
kill -9 of the leader, and ``hops cancel`` cancels by phase, by tenant and
by ids, confirming the count."""

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

CLUSTER = """\
name: holds
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
"""
TENANTS = """\
tenants:
  alice: {tokens: ["alice-token"]}
  bob: {tokens: ["bob-token"]}
"""
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
NEVER = 10**13  # samples: a job that runs until something stops it
SHORT = 10_000_000  # a second or two of wall time at x600


def A(job_id: str) -> str:
    """The key of alice's job (shared/jobkeys.py): its record's, its plans'."""
    return job_key("alice", job_id)


def B(job_id: str) -> str:
    return job_key("bob", job_id)


def spec(job_id: str, total: int = NEVER) -> dict[str, Any]:
    return catalog_spec(job_id, total, requirements=[4])  # the whole cluster


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    root = tmp_path_factory.mktemp("holds")
    tenants = root / "tenants.yaml"
    tenants.write_text(TENANTS)
    with LiveStack(root / "stack", CLUSTER, tenants=tenants) as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10) as client:
        yield client


def submit(api: httpx.Client, job_id: str, who: dict[str, str], total: int = NEVER) -> None:
    r = api.post("/jobs", json=spec(job_id, total), headers=who)
    assert r.status_code == 201, r.text


def assigned(stack: LiveStack, job_id: str) -> bool:
    return any(a["job_id"] == job_id for p in stack.bus_().plans()
               for a in p["plan"]["assignments"])


def hops(stack: LiveStack, *args: str, token: str) -> Any:
    env = {"HOPS_GATEWAY_URL": stack.config.gateway_url, "HOPS_TOKEN": token}
    return CliRunner().invoke(app, list(args), env=env)


def test_a_held_job_waits_out_of_every_plan_until_released(
    stack: LiveStack, api: httpx.Client
) -> None:
    submit(api, "held-a", ALICE)
    r = api.post("/jobs/held-a/hold", params={"reason": "data not ready"}, headers=ALICE)
    assert r.status_code == 200 and r.json() == {"ok": True, "job_id": "held-a"}, r.text
    until(lambda: (stack.record(A("held-a")) or {}).get("held"), "held-a held", 15, stack.logs)
    record = api.get("/jobs/held-a", headers=ALICE).json()
    assert record["held"] is True and record["reason"] == "held: data not ready", record
    # Another job is planned and finishes on the GPUs held-a would take.
    submit(api, "other-b", ALICE, SHORT)
    assert stack.wait_final([A("other-b")], 90) == {A("other-b"): "finished"}
    until(lambda: stack.phase(A("held-a")) == "queued", "held-a profiled and queued", 30,
          stack.logs)
    queue = api.get("/queue", headers=ALICE).json()["entries"]
    assert {"job_id": "held-a", "reason": "held"}.items() <= next(
        e for e in queue if e["job_id"] == "held-a").items(), queue
    assert not assigned(stack, A("held-a")), "a held job was planned"
    assert hops(stack, "release", "held-a", token="alice-token").output.strip() == (
        "held-a: released")
    until(lambda: stack.phase(A("held-a")) == "running", "held-a runs once released", 30,
          stack.logs)
    assert not (stack.record(A("held-a")) or {}).get("held")
    # A running job cannot be held: Slurm holds only pending jobs.
    r = api.post("/jobs/held-a/hold", headers=ALICE)
    assert r.status_code == 409 and r.json()["code"] == "not_pending", r.text
    refused = hops(stack, "hold", "held-a", token="alice-token")
    assert refused.exit_code == 1 and "not_pending" in refused.output
    # an admin names the tenant
    r = api.delete("/jobs/held-a", headers=stack.headers, params={"tenant": "alice"})
    assert r.status_code == 200, r.text


def test_a_tenant_holds_only_its_own_jobs_and_learns_nothing_of_others(
    stack: LiveStack, api: httpx.Client
) -> None:
    submit(api, "alices", ALICE)
    for verb in ("hold", "release"):
        theirs = api.post(f"/jobs/alices/{verb}", headers=BOB)
        ghost = api.post(f"/jobs/ghost/{verb}", headers=BOB)
        assert theirs.status_code == ghost.status_code == 404, (theirs.text, ghost.text)
        assert theirs.json()["error"].replace("alices", "ghost") == ghost.json()["error"]
        assert theirs.json()["code"] == ghost.json()["code"] == "not_found"
    assert not (stack.record(A("alices")) or {}).get("held")
    r = api.post("/jobs/alices/hold", headers=stack.headers, params={"tenant": "alice"})
    assert r.status_code == 200, r.text  # an admin, naming the tenant
    until(lambda: (stack.record(A("alices")) or {}).get("held"), "alices held", 15, stack.logs)
    assert api.delete("/jobs/alices", headers=ALICE).status_code == 200


def test_a_hold_outlives_a_kill_of_the_leader(stack: LiveStack, api: httpx.Client) -> None:
    submit(api, "kept", ALICE)
    assert api.post("/jobs/kept/hold", headers=ALICE).status_code == 200
    until(lambda: (stack.record(A("kept")) or {}).get("held"), "kept held", 15, stack.logs)
    lease = stack.leader()
    assert lease is not None
    stack.kill(lease["holder"])
    until(lambda: (x := stack.leader()) and x["holder"] != lease["holder"] and x["term"],
          "a new leader", 20, stack.logs)
    submit(api, "after-kill", BOB, SHORT)
    assert stack.wait_final([B("after-kill")], 90) == {B("after-kill"): "finished"}
    record = stack.record(A("kept"))
    assert record is not None and record["held"] and record["phase"] != "running", record
    assert not assigned(stack, A("kept"))
    assert api.post("/jobs/kept/release", headers=ALICE).status_code == 200
    until(lambda: stack.phase(A("kept")) == "running", "kept runs once released", 30, stack.logs)
    assert api.delete("/jobs/kept", headers=ALICE).status_code == 200


def test_bulk_cancel_by_ids_phase_and_tenant_confirms_the_count(
    stack: LiveStack, api: httpx.Client
) -> None:
    submit(api, "x3", ALICE)  # held: it stays queued, whatever else runs
    assert api.post("/jobs/x3/hold", headers=ALICE).status_code == 200
    until(lambda: stack.phase(A("x3")) == "queued", "x3 profiled and queued", 60, stack.logs)
    for job_id in ("x1", "x2"):
        submit(api, job_id, ALICE)
    submit(api, "y1", BOB)
    admin = stack.admin_token
    # No terminal to confirm on and no --yes: nothing is cancelled.
    refused = hops(stack, "cancel", "--all", token="alice-token")
    assert refused.exit_code == 2 and "--yes" in refused.output, refused.output
    assert "cancelled" not in {stack.phase(k) for k in (*map(A, ("x1", "x2", "x3")), B("y1"))}
    by_ids = hops(stack, "cancel", "x1", "alice/x2", "--tenant", "alice", "--yes", token=admin)
    assert by_ids.exit_code == 0, by_ids.output
    lines = by_ids.output.strip().splitlines()
    assert lines[0] == "2 jobs match: x1, x2" and lines[-1] == "2 of 2 cancelled", lines
    by_phase = hops(stack, "cancel", "--phase", "queued", "--tenant", "alice", "--yes",
                    token=admin)
    assert by_phase.output.strip().splitlines() == [
        "1 job match: x3", "x3: cancelled", "1 of 1 cancelled"], by_phase.output
    # A tenant's token matches its own jobs only: bob's y1 is not alice's to cancel.
    mine = hops(stack, "cancel", "--all", "--yes", token="alice-token")
    assert (mine.exit_code, mine.output.strip()) == (0, "no job matches"), mine.output
    theirs = hops(stack, "cancel", "--all", "--yes", token="bob-token")
    assert theirs.exit_code == 0 and "y1: cancelled" in theirs.output, theirs.output
    # An acknowledged cancel is on HOPS_JOBS; the leader applies it soon after.
    keys = (*map(A, ("x1", "x2", "x3")), B("y1"))
    until(lambda: all(stack.phase(k) == "cancelled" for k in keys),
          "every acknowledged cancel applied", 30,
          lambda: f"{ {k: stack.phase(k) for k in keys} }\n{stack.logs()}")
    bad = hops(stack, "cancel", "--phase", "finished", "--yes", token=admin)
    assert bad.exit_code == 2 and "cannot be cancelled" in bad.output


def test_cancel_flags_are_checked_before_anything_is_asked() -> None:
    runner = CliRunner()
    env = {"HOPS_GATEWAY_URL": "http://127.0.0.1:9"}
    for args in (["cancel"], ["cancel", "a", "--all"], ["cancel", "--phase", "nope"]):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 2, (args, result.output)
