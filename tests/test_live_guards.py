"""Hardening of the live system against the stack of real processes: jobs
that can never fit, unknown models, a job held when nodes leave, current
progress and reasons, and a burst of submissions while jobs run.

One stack (:mod:`tests.livestack`, EMULATED executors) serves the module;
each test leaves it able to run the next.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduling.profiling import profiling_budget
from services.scheduler.admission import NODES_MAX_AGE_S
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until
from world.clusters import cluster_arg

CLUSTER = """\
name: hardening
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""
NEVER = 10**13  # samples: a job that runs until something stops it
SHORT = 10_000_000
BURST = 200


def spec(job_id: str, total: int = SHORT, requirements: list[int] | None = None) -> dict[str, Any]:
    return catalog_spec(job_id, total, requirements=requirements or [1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("guards"), CLUSTER) as s:
        yield s


@pytest.fixture
def one_round(tmp_path: Path) -> Iterator[LiveStack]:
    """A stack whose first round outlasts the test: only fill plans, which
    add and never stop a running job (§3.6), so a running job that stops is
    profiling's doing, not the policy's (the 2 s rounds of :func:`stack`
    replan running jobs, and under load the burst's profiled jobs may then
    fairly take their GPUs)."""
    with LiveStack(tmp_path, CLUSTER, round_s=3600.0) as s:
        yield s


@pytest.fixture
def gateway(stack: LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as client:
        yield client


def running(stack: LiveStack, job_id: str) -> dict[str, Any] | None:
    rec = stack.record(job_id)
    return rec if rec and rec["phase"] == "running" else None


def test_jobs_that_can_never_fit_and_unknown_models_are_refused(
    stack: LiveStack, gateway: httpx.Client
) -> None:
    before = set(stack.bus_().bucket("hops_jobs"))
    huge = gateway.post("/jobs", json=spec("huge", requirements=[1000]))
    assert huge.status_code == 422, huge.text
    body = huge.json()
    assert body["code"] == "unschedulable"
    # It names the requirement and the most one GPU type holds, by type.
    assert "1000 GPUs" in body["error"] and "at most 8 GPUs" in body["error"], body
    assert "8 RTX3090" in body["error"] and "4 TitanXP" in body["error"], body
    # A job that fits one type but not another is admitted.
    assert stack.submit(spec("eight", requirements=[8]))["ok"] is True
    unknown = gateway.post("/jobs", json={**spec("gpt"), "model": "gpt-17"})
    assert unknown.status_code == 422, unknown.text
    assert "gpt-17" in unknown.json()["error"] and "resnet18-cifar10" in unknown.json()["error"]
    assert set(stack.bus_().bucket("hops_jobs")) - before == {"eight"}
    assert gateway.delete("/jobs/eight").status_code == 200


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"total_samples": 10**30}, "total_samples", "at most 1000000000000000 (1e15)"),
    ({"requirements": [1] * 20_000}, "requirements", "lists 20000 entries"),
    ({"requirements": [2, 2]}, "requirements", "repeats [2]"),
    ({"requirements": [4, 1, 2]}, "requirements", "write the set sorted, as [1, 2, 4]"),
    ({"command": ["python", "train.py"]}, "command", "every node of this cluster is emulated"),
])
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    stack: LiveStack, gateway: httpx.Client, body: dict[str, Any], field: str, words: str
) -> None:
    # every node registered (emulated: each names its models), and admission's
    # copy of them fresh
    until(lambda: len(stack.nodes()) == 3, "the three nodes registered", 30, stack.logs)
    time.sleep(NODES_MAX_AGE_S)
    before = set(stack.bus_().bucket("hops_jobs"))
    t0 = time.monotonic()
    r = gateway.post("/jobs", json={**spec("bad"), **body})
    assert (r.status_code, r.json()["code"]) == (422, "invalid"), r.text
    error = r.json()["error"]
    assert f"{field} " in error and words in error, error
    assert gateway.get("/jobs/bad").status_code == 404
    assert set(stack.bus_().bucket("hops_jobs")) == before
    # logged for the operator: an error record from the scheduler
    until(lambda: [e for e in stack.bus_().errors(since=t0) if e["service"] == "scheduler"
                   and e["code"] == "invalid" and words in e["error"]],
          "the scheduler's error record", 10)


def test_a_job_that_no_longer_fits_is_held_and_resumes_when_capacity_returns(
    stack: LiveStack,
) -> None:
    """An 8-GPU job runs over both RTX servers; one leaves (its executor is
    killed with the supervisor frozen), and the job, requeued, fits no
    alive type: it is held with reason ``unschedulable`` while a small job
    still runs; once the server is back it runs again."""
    stack.submit(spec("wide", total=NEVER, requirements=[8]))
    until(lambda: running(stack, "wide"), "wide running", 60, stack.logs)
    supervisor = stack.pid("cluster")
    os.kill(supervisor, signal.SIGSTOP)
    try:
        os.kill(stack.executor_pid("rtx-1"), signal.SIGKILL)
        until(lambda: (stack.record("wide") or {}).get("reason", "").startswith("unschedulable"),
              "wide held as unschedulable", 30, stack.logs)
        assert stack.phase("wide") == "queued"
        held_at = len(stack.bus_().plans())
        stack.submit(spec("small", requirements=[1]))
        assert stack.wait_final(["small"], 60) == {"small": "finished"}
        assert stack.phase("wide") == "queued"
        # The plans since it was held placed the small job and never the wide one.
        since = [a["job_id"] for p in stack.bus_().plans()[held_at:]
                 for a in p["plan"]["assignments"]]
        assert "small" in since and "wide" not in since, since
    finally:
        os.kill(supervisor, signal.SIGCONT)
    rec = until(lambda: running(stack, "wide"), "wide running again", 60, stack.logs)
    assert rec["reason"] == "", rec  # cleared when it started
    assert stack.bus_().request("hops.v1.jobs.cancel",
                                b'{"type": "cancel_job", "job_id": "wide"}')["ok"] is True


def test_a_running_jobs_progress_is_current_in_its_record(stack: LiveStack) -> None:
    stack.submit(spec("steady", total=NEVER, requirements=[1]))
    first = until(lambda: running(stack, "steady"), "steady running", 60, stack.logs)
    until(lambda: (stack.record("steady") or {}).get("samples_done", 0) > first["samples_done"],
          "steady's progress in its record", 20, stack.logs)
    stack.bus_().request("hops.v1.jobs.cancel", b'{"type": "cancel_job", "job_id": "steady"}')


def test_a_burst_is_profiled_within_the_share_while_running_jobs_keep_their_gpus(
    one_round: LiveStack,
) -> None:
    """Two long jobs run; a burst of submissions follows. Profiling takes at
    most its share of each type at any time and no running job's GPU: the
    long jobs are never stopped for it and none fails, and every job of the
    burst is profiled."""
    stack = one_round
    for i in range(2):
        stack.submit(spec(f"long-{i}", total=NEVER, requirements=[4]))
    for i in range(2):
        until(lambda i=i: running(stack, f"long-{i}"), f"long-{i} running", 60, stack.logs)  # type: ignore[misc]
    cluster = cluster_arg(str(stack.cluster_file))
    caps = profiling_budget(cluster, {})
    type_of = {s.id: s.gpu_type for s in cluster.servers}
    bus = stack.bus_()
    t0 = time.monotonic()
    ids = [f"b{i:03d}" for i in range(BURST)]
    for job_id in ids:
        assert stack.submit(spec(job_id, total=1_000_000))["ok"] is True
    most: Counter[str] = Counter()

    def profiled() -> bool:
        held: Counter[str] = Counter()
        for alloc in stack.allocs().values():
            if alloc["mode"] == "profile":
                for sid, g in alloc["configuration"]["parts"]:
                    held[type_of[sid]] += g
        for t, g in held.items():
            most[t] = max(most[t], g)
        phases = Counter(stack.phase(j) for j in ids)
        return phases["submitted"] + phases["profiling"] == 0

    until(profiled, "the burst profiled", 600, stack.logs)
    took = time.monotonic() - t0
    assert all(most[t] <= caps[t] for t in most), (most, caps)
    for i in range(2):
        job = f"long-{i}"
        kinds = [m.body["type"] for m in bus.job_events(job)]
        assert "job_failed" not in kinds and "job_stopped" not in kinds, (job, kinds)
        assert running(stack, job) is not None
    assert not [j for j in ids if stack.phase(j) == "failed"]
    print(f"burst of {BURST} profiled in {took:.1f} s; most profiling GPUs per type {dict(most)}")
