"""The whole live system end to end, and its faults.

One stack (:mod:`tests.livestack`: nats-server, the monitor, estimator,
profiler, two scheduler replicas, the placer, the gateway and a
three-server EMULATED cluster, each its own OS process, as ``hops up``
runs them) serves every test of this module, in order: jobs through NATS,
REST and a bare nats-py client; bad input; then the faults, each leaving
the system able to run the next test: a job process killed, an executor
killed, the scheduler leader killed, and nats-server stopped and started
again. docs/live.md describes the behaviour these tests hold the system to.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest

from tests.helpers import catalog_spec, timeline_of
from tests.livestack import FINAL, LiveStack, until

CLUSTER = """\
name: e2e
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""
TYPES = {"RTX3090", "TitanXP"}
HEARTBEAT_TIMEOUT_S = 3.0  # the monitor's default deadline
NEVER = 10**13  # samples: a job that runs until something stops it
SHORT = 10_000_000  # a second or two of wall time at x600


def spec(job_id: str, model: str = "resnet18-cifar10", total: int = SHORT,
         **gpus: Any) -> dict[str, Any]:
    return catalog_spec(job_id, total, model, **(gpus or {"requirements": [1, 2]}))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("e2e"), CLUSTER) as s:
        yield s


@pytest.fixture
def gateway(stack: LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as client:
        yield client


def check_ran_to_the_end(stack: LiveStack, job_id: str) -> None:
    """Every step of a job's life is on the record: profiles stored on
    HOPS_SAMPLES for every GPU type, ``job_profiled``, a plan that profiles
    it and one that assigns it, its placement in ``hops_alloc``,
    ``job_started`` and ``job_finished`` stored on HOPS_JOBS, the record
    ``finished``, and its GPUs free again."""
    bus = stack.bus_()
    why = f"{job_id}\n{stack.logs()}"
    profiles = bus.stored("HOPS_SAMPLES", f"hops.v1.profiles.{job_id}")
    assert {p["report"]["gpu_type"] for p in profiles} == TYPES, why
    stored = bus.stored("HOPS_JOBS", f"hops.v1.jobs.events.{job_id}")
    kinds = [e["type"] for e in stored]
    assert kinds[0] == "job_submitted" and "job_finished" in kinds, (kinds, why)
    # A first plan may stop a job in the instant it finishes; nothing else follows.
    assert set(kinds[kinds.index("job_finished") + 1 :]) <= {"job_stopped"}, (kinds, why)
    assert set(stored[kinds.index("job_profiled", 0)]["gpu_types"]) <= TYPES
    assert set([e for e in stored if e["type"] == "job_profiled"][-1]["gpu_types"]) == TYPES
    started = [e for e in stored if e["type"] == "job_started"]
    assert started, (kinds, why)
    plans = bus.plans()
    assert any(t["job_id"] == job_id for p in plans for t in p["plan"]["profiling"]), why
    assigned = [a["config"] for p in plans for a in p["plan"]["assignments"]
                if a["job_id"] == job_id]
    assert started[0]["configuration"] in assigned, why
    puts = [m.body for m in bus.alloc_changes(job_id) if m.op == "PUT"]
    assert {p["mode"] for p in puts} == {"profile", "run"}, why
    assert started[0]["configuration"] in [p["configuration"] for p in puts if p["mode"] == "run"]
    record = stack.record(job_id)
    assert record is not None and record["phase"] == "finished", why
    assert record["samples_done"] == record["spec"]["total_samples"]
    assert record["first_start"] is not None and record["finished_at"] is not None
    until(lambda: job_id not in stack.allocs(), f"{job_id}'s GPUs released", 10, stack.logs)
    # Its executors' reports and heartbeats were all its own: the monitor refused none.
    refused = [e for e in bus.errors() if e["code"] == "forbidden" and job_id in e["error"]]
    assert not refused, (refused, why)


def test_jobs_submitted_over_nats_and_rest_are_profiled_placed_and_finish(
    stack: LiveStack, gateway: httpx.Client
) -> None:
    by_nats = stack.submit(spec("via-nats", "resnet18-cifar10"))
    assert by_nats["ok"] is True and by_nats["job_id"] == "via-nats", by_nats
    by_rest = gateway.post("/jobs", json=spec("via-rest", "vgg11-cifar10", min_gpus=1,
                                              max_gpus=4))
    assert by_rest.status_code == 201, by_rest.text
    assert by_rest.json()["job_id"] == "via-rest"
    assert by_rest.headers["location"] == "/jobs/via-rest"
    phases = stack.wait_final(["via-nats", "via-rest"], 60)
    assert phases == {"via-nats": "finished", "via-rest": "finished"}, stack.logs()
    for job_id in phases:
        check_ran_to_the_end(stack, job_id)
    listed = gateway.get("/jobs", params={"phase": "finished"}).json()
    assert {"via-nats", "via-rest"} <= {j["job_id"] for j in listed["jobs"]}


# A client that knows nothing of Hops but the subjects and the JSON of
# docs/events.md, with its tenant's credential (docs/security.md).
RAW_CLIENT = """
import asyncio, json, sys
import nats

async def main():
    errors = []
    async def on_error(e):
        errors.append(str(e))
    nc = await nats.connect(sys.argv[1], nkeys_seed=sys.argv[2],
                            inbox_prefix="_INBOX.tenant-default", error_cb=on_error)
    feed = await nc.subscribe("hops.v1.tenants.default.events.raw-1")
    await nc.subscribe("hops.v1.jobs.events.>")  # the system's history: not a tenant's
    body = (b'{"type": "submit_job", "spec": {"id": "raw-1", "model": "resnet50-cifar10",'
            b' "batch_size": 256, "params": 23528522, "total_samples": 20000000,'
            b' "min_gpus": 1, "max_gpus": 4}}')
    msg = await nc.request("hops.v1.jobs.submit.default", body, timeout=10)
    print(msg.data.decode())
    kinds = []
    while "job_finished" not in kinds:
        kinds.append(json.loads((await feed.next_msg(timeout=60)).data)["type"])
    print(json.dumps(kinds))
    print(json.dumps([e for e in errors if "permissions violation" in e.lower()]))
    ours = ("shared", "services", "hops", "cli", "experiments", "executor", "gateway",
            "simulator", "world", "tests")
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(ours))))
    await nc.close()

asyncio.run(main())
"""


def test_a_tenant_nats_client_submits_raw_json_and_follows_its_job(
    stack: LiveStack, tmp_path: Path
) -> None:
    seed = stack.config.credentials_dir / "tenant-default.nk"
    # -I: isolated, neither the working directory nor PYTHONPATH is on the path
    done = subprocess.run([sys.executable, "-I", "-c", RAW_CLIENT, stack.config.nats_url,
                           str(seed)], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    reply_line, kinds_line, refused_line, imported = done.stdout.splitlines()
    reply = json.loads(reply_line)
    assert (reply["type"], reply["ok"], reply["job_id"]) == ("reply", True, "raw-1"), reply
    kinds = json.loads(kinds_line)
    assert kinds[0] == "job_submitted" and kinds[-1] == "job_finished", kinds
    assert "job_explained" in kinds, kinds  # its timeline rides along (shared.explain_events)
    refused = json.loads(refused_line)
    assert len(refused) == 1 and "hops.v1.jobs.events.>" in refused[0], refused
    assert json.loads(imported) == []
    assert stack.wait_final(["raw-1"], 60) == {"raw-1": "finished"}
    check_ran_to_the_end(stack, "raw-1")


def test_nats_refuses_an_anonymous_client_and_the_monitor_records_it(stack: LiveStack) -> None:
    """No credential, no connection (nats-server's own refusal); the monitor
    turns the server's advisory into an ``unauthorized`` error record."""
    t0 = time.monotonic()

    async def anonymous() -> None:
        await nats.connect(stack.config.nats_url, allow_reconnect=False,
                           max_reconnect_attempts=0, connect_timeout=2, name="intruder")

    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        asyncio.run(anonymous())
    until(lambda: [e for e in stack.bus_().errors(since=t0)
                   if (e.get("service"), e.get("code")) == ("nats", "unauthorized")],
          "the refusal recorded", 15, stack.logs)

    def counted() -> bool:
        text = httpx.get(stack.config.metrics_url, timeout=5).text
        return 'hops_refused_total{code="unauthorized",service="nats"}' in text

    until(counted, "the refusal counted in hops_refused_total", 15, stack.logs)


def test_bad_input_gets_clear_errors_and_changes_nothing(
    stack: LiveStack, gateway: httpx.Client
) -> None:
    bus = stack.bus_()
    t0 = time.monotonic()
    jobs_before = set(bus.bucket("hops_jobs"))
    invalid = json.dumps({"type": "submit_job", "spec": {**spec("bad-spec"), "batch_size": 0}})
    oversized = json.dumps({"type": "submit_job",
                            "spec": {**spec("bad-big"), "model": "m" * 300_000}})
    cases = [  # (body, NATS code, HTTP status)
        (invalid.encode(), "invalid", 422),
        (b'{"type": "submit_job", "spec": ', "malformed", 400),
        (b'{"type": "no_such_message"}', "unknown_type", 400),
        (oversized.encode(), "too_large", 413),
    ]
    for body, code, status in cases:
        reply = bus.request("hops.v1.jobs.submit", body)
        assert (reply["ok"], reply["code"]) == (False, code), reply
        assert reply["error"], reply
        answer = gateway.post("/jobs", content=body,
                              headers={"content-type": "application/json"})
        assert answer.status_code == status, answer.text
        assert answer.json()["code"] == code
    ghost_cancel = bus.request("hops.v1.jobs.cancel",
                               b'{"type": "cancel_job", "job_id": "no-such-job"}')
    assert (ghost_cancel["ok"], ghost_cancel["code"]) == (False, "not_found"), ghost_cancel
    assert gateway.delete("/jobs/no-such-job").status_code == 404
    beat = {"type": "node_heartbeat", "server_id": "ghost-0", "at": time.time(), "running": []}
    bus.call(bus.nc.publish("hops.v1.nodes.heartbeat.ghost-0", json.dumps(beat).encode()))

    def recorded() -> set[tuple[str, str, str]] | None:
        seen = {(e["service"], e["subject"], e["code"]) for e in bus.errors(since=t0)}
        wanted = {
            ("scheduler", "hops.v1.jobs.submit", "invalid"),
            ("scheduler", "hops.v1.jobs.submit", "malformed"),
            ("scheduler", "hops.v1.jobs.submit", "unknown_type"),
            ("scheduler", "hops.v1.jobs.submit", "too_large"),
            ("gateway", "hops.v1.jobs.submit", "too_large"),  # refused before NATS
            ("scheduler", "hops.v1.jobs.cancel", "not_found"),
            ("monitor", "hops.v1.nodes.heartbeat.ghost-0", "not_found"),
        }
        return seen if wanted <= seen else None

    until(recorded, "an error record for each bad input", 10,
          lambda: json.dumps(bus.errors(since=t0), indent=1))
    assert set(bus.bucket("hops_jobs")) == jobs_before
    assert "ghost-0" not in stack.nodes()
    assert not [m for m in bus.messages("hops.v1.jobs.events.", since=t0)
                if m.subject.rsplit(".", 1)[1] in ("bad-spec", "bad-big", "no-such-job")]
    assert all(stack.running(name) for name in stack.procs), stack.said
    assert stack.all_healthy()
    assert stack.submit(spec("after-bad"))["ok"] is True
    assert stack.wait_final(["after-bad"], 60) == {"after-bad": "finished"}


def wait_running(stack: LiveStack, job_id: str, timeout: float = 60) -> dict[str, Any]:
    """The job's record once it runs and its lead process is up."""
    def running() -> dict[str, Any] | None:
        rec = stack.record(job_id)
        if rec and rec["phase"] == "running" and stack.job_pids(job_id, "lead"):
            return rec
        return None

    return until(running, f"{job_id} running", timeout, stack.logs)


def released_after(stack: LiveStack, job_id: str, t0: float) -> list[dict[str, Any]]:
    return [m.body for m in stack.bus_().messages("hops.v1.cluster.released", since=t0)
            if m.body.get("job_id") == job_id]


def test_a_killed_job_process_releases_its_gpus_and_fails_the_job(stack: LiveStack) -> None:
    stack.submit(spec("victim", total=NEVER, requirements=[1]))
    wait_running(stack, "victim")
    t0 = time.monotonic()
    for pid in stack.job_pids("victim"):
        os.kill(pid, signal.SIGKILL)
    deadline = HEARTBEAT_TIMEOUT_S + 2
    until(lambda: "victim" not in stack.allocs(), "the victim's placement deleted", deadline,
          stack.logs)
    until(lambda: released_after(stack, "victim", t0), "resources_released", deadline)
    assert time.monotonic() - t0 <= deadline
    # The executor saw its process die (exit -9) and says so; the monitor would
    # have said "heartbeat lost" had the executor not: failed either way.
    until(lambda: stack.phase("victim") == "failed", "victim failed", 10, stack.logs)
    reason = stack.record("victim")["reason"]  # type: ignore[index]
    assert "exited with code -9" in reason or "heartbeat lost" in reason, reason


def test_a_killed_executor_loses_its_node_and_its_jobs_are_requeued(
    stack: LiveStack, gateway: httpx.Client
) -> None:
    """The supervisor is frozen first, or it would restart the executor
    within a second and the node would not be lost; thawed, it restarts the
    executor and the node is alive again."""
    stack.submit(spec("stray", total=NEVER, requirements=[2]))
    rec = wait_running(stack, "stray")
    server = rec["configuration"]["parts"][0][0]
    supervisor = stack.pid("cluster")
    t0 = time.monotonic()
    os.kill(supervisor, signal.SIGSTOP)
    try:
        os.kill(stack.executor_pid(server), signal.SIGKILL)
        deadline = HEARTBEAT_TIMEOUT_S + 2
        until(lambda: stack.nodes()[server]["alive"] is False, f"{server} lost", deadline,
              stack.logs)
        until(lambda: released_after(stack, "stray", t0), "stray released", deadline)
        assert released_after(stack, "stray", t0)[0]["reason"] == "node lost"
        stopped = [m.body for m in stack.bus_().job_events("stray", "job_stopped")]
        assert stopped and stopped[-1]["reason"] == "node lost", stopped

        def elsewhere() -> bool:
            r = stack.record("stray") or {}
            parts = (r.get("configuration") or {}).get("parts", [])
            return r.get("phase") == "running" and server not in {s for s, _ in parts}

        until(elsewhere, "stray requeued and running on another server", 30, stack.logs)
        assert stack.record("stray")["restarts"] >= 1  # type: ignore[index]
    finally:
        os.kill(supervisor, signal.SIGCONT)
    until(lambda: stack.nodes()[server]["alive"] is True, f"{server} back", 30, stack.logs)
    assert gateway.delete("/jobs/stray", params={"reason": "test over"}).status_code == 200
    until(lambda: stack.phase("stray") == "cancelled" and "stray" not in stack.allocs(),
          "stray cancelled and released", 15, stack.logs)


def test_the_standby_takes_over_when_the_leader_is_killed(stack: LiveStack) -> None:
    lease = stack.leader()
    assert lease is not None
    leader, term = lease["holder"], lease["term"]
    before, during = ["before-kill"], ["during-failover"]
    for job_id in before:
        assert stack.submit(spec(job_id))["ok"] is True
    stack.kill(leader)
    for job_id in during:  # answered by the standby's admission
        reply = stack.submit(spec(job_id))
        assert reply["ok"] is True, reply

    def new_term() -> int | None:  # a new leader's term is set on its first refresh
        lease = stack.leader()
        return lease["term"] if lease and lease["holder"] != leader and lease["term"] else None

    assert until(new_term, "a new leader", 15, stack.logs) > term
    until(lambda: any(p["term"] > term for p in stack.bus_().plans()),
          "a plan of the new term", 15, stack.logs)
    phases = stack.wait_final(before + during, 60)
    assert set(phases.values()) == {"finished"}, phases
    # each job's timeline, begun by one leader and ended by the next, is whole
    # and outlives the job
    for job_id in before + during:
        # A leader killed after writing a job's record and before storing its
        # timeline entry leaves the event unacked: the next leader stores the
        # entry when the event is redelivered (ack wait 10 s), possibly after
        # later entries; the gateway orders a timeline by time.
        kinds = until(lambda j=job_id: (  # type: ignore[misc]
            k if "submitted" in (k := in_time_order(stack, j)) else None),
            f"{job_id} submitted on its timeline", 30)
        assert "started" in kinds, (job_id, kinds)
        # in the order things happened (the gateway's), it begins with the
        # submission and ends with the finish
        ordered = until(lambda j=job_id: in_time_order(stack, j)  # type: ignore[misc]
                        if in_time_order(stack, j)[-1] == "finished" else None,
                        f"{job_id} finished on its timeline", 15)
        assert ordered[0] == "submitted", (job_id, ordered)
    for job_id in before + during:
        stored = stack.bus_().stored("HOPS_JOBS", f"hops.v1.jobs.events.{job_id}")
        assert stored and stored[0]["type"] == "job_submitted", job_id


def in_time_order(stack: LiveStack, job_id: str) -> list[str]:
    """A job's timeline entries' kinds in the order they happened."""
    entries = timeline_of(stack.bus_().stored, job_id)
    return [e["kind"] for e in sorted(entries, key=lambda e: e["at"])]


def test_nothing_accepted_is_lost_when_nats_restarts(stack: LiveStack) -> None:
    jobs = [f"outage-{i}" for i in range(2)]
    for i, job_id in enumerate(jobs):
        total = 60_000_000 if i == 0 else SHORT
        assert stack.submit(spec(job_id, total=total))["ok"] is True
    wait_running(stack, jobs[0])
    services = [n for n in stack.health if stack.running(n)]
    stack.nats.stop()
    until(lambda: not any(stack.healthy(n) for n in services),
          "every service sees NATS gone", 15)
    stack.nats.start()  # the same port and data dir
    until(lambda: all(stack.healthy(n) for n in services), "every service reconnected", 30,
          stack.logs)
    until(stack.bus_().connected, "the test's client reconnected", 15)
    records = stack.bus_().bucket("hops_jobs")
    accepted = [m.body["job_id"] for m in stack.bus_().messages("hops.v1.jobs.events.",
                                                                   "job_submitted")]
    assert set(accepted) <= set(records), set(accepted) - set(records)
    for job_id in accepted:
        stored = stack.bus_().stored("HOPS_JOBS", f"hops.v1.jobs.events.{job_id}")
        assert stored and stored[0]["type"] == "job_submitted", job_id
    assert stack.submit(spec("after-outage"))["ok"] is True
    phases = stack.wait_final([*jobs, "after-outage"], 90)
    assert set(phases.values()) == {"finished"}, phases
    unfinished = {j for j, r in stack.bus_().bucket("hops_jobs").items()
                  if r["phase"] not in FINAL and j not in ("stray", "victim")}
    assert not unfinished, unfinished
