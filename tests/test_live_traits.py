"""A policy registered outside the registry runs in the live system with no
change to the mechanism: nats-server, every service and an EMULATED cluster
whose servers declare cores, the real scheduler launched by
tests/traits_policy.py with ``HOPS_POLICY=test-cores``, a policy whose own
layer claims the trait ``schedules_cores``. A CPU job submitted through the
gateway, which a GPU-only policy refuses (tests/test_live_cpu_jobs.py), is
admitted, planned on cores alone, run and finished."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.livestack import LiveStack, until
from tests.test_live_cpu_jobs import CLUSTER  # servers that declare cores
from tests.traits_policy import NAME


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LiveStack]:
    with LiveStack(tmp_path, CLUSTER, schedulers=1, env={"HOPS_POLICY": NAME},
                   modules={"scheduler": "tests.traits_policy"}) as s:
        yield s


def test_a_registered_policy_with_cores_runs_a_cpu_job(stack: LiveStack) -> None:
    job = {"id": "etl-1", "model": "etl", "batch_size": 1, "params": 1,
           "total_samples": 200, "kind": "cpu", "cores": 4}
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as gw:
        answer = gw.post("/jobs", json=job)
        assert answer.status_code == 201, answer.text
    until(lambda: "etl-1" in stack.allocs() or stack.phase("etl-1") == "finished",
          "etl-1 placed", 90, stack.logs)
    placed = stack.allocs().get("etl-1")
    if placed is not None:  # cores on one server, no GPU
        ((_, gpus),) = placed["configuration"]["parts"]
        assert gpus == 0, placed
    assert stack.wait_final(["etl-1"], 90) == {"etl-1": "finished"}
    plans = stack.bus_().plans()
    assert any(p["plan"]["reasons"]["policy"] == "hops" for p in plans)
    assert any(r["name"] == "fifo" for p in plans for r in p["plan"]["reasons"]["layers"])
