"""Profiles reused on the real stack (nats-server, every service and an
emulated cluster of two GPU types, each its own process): the second job of
a profile signature gets no profiling run, is queued with both types in its
``profiled`` list and runs; a job of another signature is profiled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until

CLUSTER = """\
name: reuse
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""
TYPES = ["RTX3090", "TitanXP"]
SHORT = 10_000_000  # a second or two of wall time at x600


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("reuse") / "stack", CLUSTER) as s:
        yield s


def submit(stack: LiveStack, job_id: str, model: str = "resnet18-cifar10") -> None:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10) as api:
        r = api.post("/jobs", json=catalog_spec(job_id, SHORT, model, requirements=[1]),
                     headers=stack.headers)
    assert r.status_code == 201, r.text


def profiled_by_plans(stack: LiveStack, job_id: str) -> set[str]:
    return {t["gpu_type"] for p in stack.bus_().plans() for t in p["plan"]["profiling"]
            if t["job_id"] == job_id}


def finished(stack: LiveStack, job_id: str) -> dict[str, Any] | None:
    rec = stack.record(job_id)
    return rec if rec is not None and rec["phase"] == "finished" else None


def test_the_second_job_of_a_signature_is_not_profiled(stack: LiveStack) -> None:
    submit(stack, "first")
    until(lambda: finished(stack, "first"), "first finished", 60, stack.logs)
    assert profiled_by_plans(stack, "first") == set(TYPES)
    submit(stack, "second")
    rec = until(lambda: finished(stack, "second"), "second finished", 60, stack.logs)
    assert sorted(rec["profiled"]) == TYPES
    assert profiled_by_plans(stack, "second") == set()
    assert "profiles reused" in stack.logs(tail=10**7)


def test_a_job_of_another_signature_is_profiled(stack: LiveStack) -> None:
    submit(stack, "other", model="resnet50-cifar10")
    until(lambda: finished(stack, "other"), "other finished", 60, stack.logs)
    assert profiled_by_plans(stack, "other") == set(TYPES)
