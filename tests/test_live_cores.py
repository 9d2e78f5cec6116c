"""CPU cores through the live system: nats-server, every service and an
EMULATED cluster whose servers declare cores, each its own OS process, with
the real scheduler running a test layer (tests/cores_layer.py) that
attaches ``HOPS_TEST_CORES_PER_GPU`` cores per GPU to every run.

* The cores reach every step: the executors register them
  (``hops_nodes``), the plan's assignment carries them, the placer books
  them (``hops_alloc``, ``job_started``), the executor starts the job with
  them (its log), and the gateway's cluster view shows each server's
  capacity; the job runs to the end and everything is given back. An
  executor refuses a start over its server's cores by itself (``invalid``).
* More cores per GPU than a server has: the leader's plan check refuses the
  plan (``plan_refused``, naming CPU cores) before it reaches the placer, as
  the simulator does; the job is never started, and stays queued. (The
  placer's own refusal of a start over the cores, a ``conflict``, is what
  catches a plan made on a view that is already stale:
  tests/test_placer_resources.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from shared import events as ev
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.resources import Resources
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until

CLUSTER = """\
name: cores
gpu_types:
  - {{name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}}
  - {{name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}}
servers:
  - {{id: rtx-0, gpu_type: RTX3090, gpus: 4, cores: {cores}}}
  - {{id: titan-0, gpu_type: TitanXP, gpus: 4, cores: {cores}}}
"""
SHORT = 10_000_000  # a second or two of wall time at x600


def cores_stack(root: Path, cores: int, per_gpu: int) -> LiveStack:
    return LiveStack(root, CLUSTER.format(cores=cores), schedulers=1,
                     env={"HOPS_TEST_CORES_PER_GPU": str(per_gpu)},
                     modules={"scheduler": "tests.cores_layer"})


@pytest.fixture
def roomy(tmp_path: Path) -> Iterator[LiveStack]:
    """Servers of 16 cores; 2 cores per GPU."""
    with cores_stack(tmp_path, cores=16, per_gpu=2) as s:
        yield s


@pytest.fixture
def cramped(tmp_path: Path) -> Iterator[LiveStack]:
    """Servers of 4 cores; 8 cores per GPU: no run fits anywhere."""
    with cores_stack(tmp_path, cores=4, per_gpu=8) as s:
        yield s


def log_lines(stack: LiveStack, component: str) -> list[dict[str, Any]]:
    out = []
    for line in (stack.data_dir / "logs" / f"{component}.log").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def cores_of(configuration: dict[str, Any]) -> dict[str, int]:
    """Cores per server of a configuration's JSON (none: GPUs only)."""
    extras = configuration.get("extras", [])
    return {s: e.get("cores", 0) for (s, _), e in zip(configuration["parts"], extras,
                                                      strict=True)}


def test_cores_are_registered_booked_and_started_with(roomy: LiveStack) -> None:
    stack, bus = roomy, roomy.bus_()
    assert {k: n["server"]["cores"] for k, n in stack.nodes().items()} == {
        "rtx-0": 16, "titan-0": 16}
    reply = stack.submit(catalog_spec("c1", SHORT, requirements=[1, 2]))
    assert reply["ok"] is True, reply
    assert stack.wait_final(["c1"], 90) == {"c1": "finished"}, stack.logs()
    why = stack.logs()

    # The plan's assignment, the placement and job_started carry 2 cores per GPU.
    assigned = [a["config"] for p in bus.plans() for a in p["plan"]["assignments"]
                if a["job_id"] == "c1"]
    assert assigned, why
    for config in assigned:
        assert cores_of(config) == {s: 2 * g for s, g in config["parts"]}, config
    runs = [m.body for m in bus.alloc_changes("c1") if m.op == "PUT" and m.body["mode"] == "run"]
    assert runs, why
    run = runs[0]["configuration"]
    assert cores_of(run) == {s: 2 * g for s, g in run["parts"]}, run
    started = [e["configuration"] for e in bus.stored("HOPS_JOBS", "hops.v1.jobs.events.c1")
               if e["type"] == "job_started"]
    assert started and started[0] == run, (started, run)

    # Each executor of the placement started its part with its cores.
    launched = {x["server_id"]: x["cores"] for x in log_lines(stack, "cluster")
                if x.get("event") == "job process started" and x.get("job_id") == "c1"
                and x.get("mode") == "run"}
    assert launched == {s: 2 * g for s, g in run["parts"]}, (launched, why)

    # The gateway shows each server's capacity, and nothing held once the job is gone.
    until(lambda: "c1" not in stack.allocs(), "c1's resources released", 10, stack.logs)
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as gw:
        servers = gw.get("/cluster").json()["servers"]
    assert {s["id"]: s["capacity"]["cores"] for s in servers} == {"rtx-0": 16, "titan-0": 16}
    assert all(s["allocated"] == {"gpus": 0, "cores": 0, "memory_mb": 0} for s in servers)
    assert not [e for e in bus.errors() if e["code"] == "conflict"], why

    # An executor checks for itself: more cores than its server has is invalid.
    over = Configuration.of({"rtx-0": 1}).with_extras({ServerId("rtx-0"): Resources(cores=17)})
    cmd = ev.StartJob(key="start:test:over@rtx-0", job_id=JobId("over"),
                      server_id=ServerId("rtx-0"),
                      spec=msgspec.convert(catalog_spec("over", SHORT, requirements=[1]),
                                           JobSpec),
                      configuration=over, gpu_indices=(0,))
    ack = bus.request("hops.v1.exec.rtx-0", ev.encode(cmd))
    assert (ack["ok"], ack["code"], ack["error"]) == (
        False, "invalid", "rtx-0 has 16 CPU cores; job over needs 17"), ack


def test_a_start_over_the_cores_is_refused_and_the_job_stays_queued(
    cramped: LiveStack,
) -> None:
    stack, bus = cramped, cramped.bus_()
    assert stack.submit(catalog_spec("c2", SHORT, requirements=[1]))["ok"] is True

    def refused() -> dict[str, Any] | None:
        return next((e for e in bus.errors() if e["code"] == "plan_refused"
                     and "CPU cores" in e["error"]), None)

    error = until(refused, "the leader refusing the plan over c2's cores", 60, stack.logs)
    assert error["service"] == "scheduler", error
    # e.g. "plan refused: rtx-0 has 4 CPU cores free of 4, 8 needed"
    assert "has 4 CPU cores free of 4, 8 needed" in error["error"], error
    # A later round plans it again, and is refused again: never started, still queued.
    until(lambda: len([e for e in bus.errors() if e["code"] == "plan_refused"]) >= 2,
          "a second refusal", 30, stack.logs)
    kinds = [e["type"] for e in bus.stored("HOPS_JOBS", "hops.v1.jobs.events.c2")]
    assert "job_started" not in kinds and "job_failed" not in kinds, kinds
    assert stack.phase("c2") == "queued", stack.record("c2")
    runs = [m for m in bus.alloc_changes("c2") if m.op == "PUT" and m.body["mode"] == "run"]
    assert runs == [], runs
    assert not [x for x in log_lines(stack, "cluster")
                if x.get("event") == "job process started" and x.get("job_id") == "c2"
                and x.get("mode") == "run"]
