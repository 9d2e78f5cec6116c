"""CODA through the whole live system on the CPU: nats-server, every service
and a REAL executor (examples/train_cnn.py with the in-job plugin, a CPU
core standing in for the GPU), the scheduler running ``coda``.

The training job starts at one core per GPU (``start_cv=1``) beside a CPU
job holding the other core. When the CPU job has ended, the allocator's
climb gives the training job two cores in place (``set_cores``: the same
process, re-pinned); its measured throughput, which the allocator climbs
on, rises; every thread of it is pinned to exactly the cores it holds.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduling.cores.allocator import Climb
from scheduling.cores.state import decode
from services.runtime.objects import get_object
from shared import subjects
from shared.ids import JobId
from tests.livestack import LiveStack, until

ROOT = Path(__file__).resolve().parent.parent
CNN = ROOT / "examples" / "train_cnn.py"
CNN_PARAMS = 113_738
CLUSTER = """\
name: coda-local
gpu_types:
  - {name: cpu, link_bandwidth: 2.5e8, net_bandwidth: 5.0e8, overlap_residual: 1.0}
servers:
  - {id: local-a, gpu_type: cpu, gpus: 1, cores: 2}
"""
PERIOD_S = 8.0

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="needs two cores to give a job one, then two")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LiveStack]:
    env = {"HOPS_PROFILE_ITERS": "5", "HOPS_SAMPLE_S": "0.5", "HOPS_STOP_GRACE_S": "15",
           "HOPS_ALLOW_ROOT_JOBS": "1"}
    # Both cores in the GPU array: the CPU job borrows the idle one.
    policy = f"coda:start_cv=1,reserve_per_gpu=2,period_s={PERIOD_S},subarrays=false"
    with LiveStack(tmp_path, CLUSTER, env=env, executor="real", schedulers=1,
                   policy=policy) as s:
        yield s


def pids_of(script: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(script.encode() in part for part in cmdline):
                out.append(int(entry.name))
    return out


def affinities(script: str) -> set[frozenset[int]]:
    """The CPU affinity of every thread of every process running ``script``."""
    out: set[frozenset[int]] = set()
    for pid in pids_of(script):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                out.add(frozenset(os.sched_getaffinity(int(task.name))))
            except OSError:
                continue
    return out


def climb(stack: LiveStack, job: str) -> Climb | None:
    """The allocator's climb of ``job`` as the leader keeps it (object
    ``layer.coda`` of ``hops_state``, the core layer's state)."""
    bus = stack.bus_()
    raw = bus.call(get_object(bus.nc.jetstream(), subjects.OBJ_STATE, "layer.coda"))
    return None if not raw else decode(raw).climbs.get(JobId(job))


def test_the_allocator_gives_a_real_training_job_more_cores_in_place(stack: LiveStack) -> None:
    spec: dict[str, Any] = {
        "id": "cnn", "model": "train_cnn", "batch_size": 32, "params": CNN_PARAMS,
        "total_samples": 400_000, "requirements": [1], "base_lr": 0.05,
        "category": "cv", "command": [sys.executable, str(CNN)], "workdir": str(ROOT)}
    cpu_job = {"id": "side", "model": "cpu", "batch_size": 1, "params": 1,
               "total_samples": 1, "kind": "cpu", "cores": 1,
               "command": [sys.executable, "-c", "import time; time.sleep(4)"],
               "workdir": str(ROOT)}
    assert stack.submit(spec)["ok"] is True
    until(lambda: (stack.record("cnn") or {}).get("phase") == "running", "cnn running", 90,
          stack.logs)
    assert stack.submit(cpu_job)["ok"] is True
    # One core each, side by side: every thread of the job on exactly its core.
    until(lambda: (stack.record("side") or {}).get("phase") in ("running", "finished"),
          "the CPU job started", 30, stack.logs)
    one = affinities(str(CNN))
    assert len(one) == 1 and len(next(iter(one))) == 1, one
    assert stack.wait_final(["side"], 60) == {"side": "finished"}
    # The climb: one core measured, then two, in place.
    until(lambda: any(len(a) == 2 for a in affinities(str(CNN))) or None,
          "the job re-pinned to two cores", 90, stack.logs)
    pids = set(pids_of(str(CNN)))
    two = affinities(str(CNN))
    assert two == {frozenset(os.sched_getaffinity(0)) & frozenset({0, 1}) or frozenset({0, 1})}
    samples = until(lambda: _two_samples(stack), "two samples of the climb", 90, stack.logs)
    (one_core, t1), (two_cores, t2) = samples[:2]
    assert (one_core, two_cores) == (1, 2)
    assert t2 > t1, samples  # more cores, more samples per second
    assert set(pids_of(str(CNN))) <= pids  # the same processes: no restart
    record = stack.record("cnn")
    assert record is not None and record.get("restarts", 1) <= 1, record


def _two_samples(stack: LiveStack, job: str = "cnn") -> list[tuple[int, float]] | None:
    c = climb(stack, job)
    if c is None or len(c.samples) < 2:
        return None
    return list(c.samples)


EMULATED = """\
name: coda-emulated
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4, cores: 16, memory_bandwidth_gbps: 100}
"""


def test_coda_on_an_emulated_cluster_runs_cpu_jobs_and_changes_cores_in_place(
        tmp_path: Path) -> None:
    from tests.helpers import catalog_spec

    with LiveStack(tmp_path, EMULATED, schedulers=1,
                   policy="coda:period_s=2,subarrays=false") as stack:
        gpu = {**catalog_spec("g", 60_000_000, requirements=[1]), "category": "cv"}
        cpu_job = {"id": "c", "model": "cpu", "batch_size": 1, "params": 1,
                   "total_samples": 600 * 2, "kind": "cpu", "cores": 2}  # 2 min at x600
        for spec in (gpu, cpu_job):
            assert stack.submit(spec)["ok"] is True, spec
        assert stack.wait_final(["c"], 60) == {"c": "finished"}, stack.logs()
        samples = until(lambda: _two_samples(stack, "g"), "two samples of g's climb", 60,
                        stack.logs)
        assert samples[0][0] != samples[1][0], samples  # it moved
        assert stack.wait_final(["g"], 120) == {"g": "finished"}, stack.logs()
        held = {json.dumps(m.body.get("configuration", {}).get("extras"))
                for m in stack.bus_().alloc_changes("g") if isinstance(m.body, dict)}
        assert len(held - {"null"}) >= 2, held  # hops_alloc followed the cores
        assert len(stack.bus_().job_events("g", "job_started")) == 1  # changed in place
