"""Real jobs under Slurm: the live stack with the Slurm bridge running real
jobs (``HOPS_EXECUTOR_BACKEND=real``, as ``--backend real`` for executors)
over the real cluster of tests/slurmcluster.py.

``examples/train_cnn.py`` (PyTorch with the in-job plugin, on the CPU: one
process stands in for a GPU, as in tests/test_real_training.py) is profiled
as a Slurm job, runs on the planned node (``scontrol show job``), is
preempted with a checkpoint (its node drained in Hops with ``--move``: the
bridge's stop, SIGTERM through Slurm, the plugin checkpoints), resumes on
another node from its checkpoint (the run folder is shared: one host here,
a shared filesystem on a Slurm cluster) and finishes with every sample. Its
reports reach the estimator through the bridge, with the node's identity.
``examples/train_lm.py`` is profiled and runs to its last sample the same way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from executor.launch import job_paths
from executor.slurm.client import SlurmClient
from executor.slurm.nodes import cluster_doc
from shared.jobreport import AnyReport, Checkpointed, Finished, Started, decode_line
from tests.livestack import LiveStack, until
from tests.slurmcluster import SlurmCluster, slurm_cluster
from tests.test_live_hardening import hops
from tests.test_live_slurm import planned, running_in_slurm, slurm_jobs

__all__ = ["slurm_cluster"]

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "train_cnn.py"
CNN_PARAMS = 113_738  # SmallCNN
LM = ROOT / "examples" / "train_lm.py"
LM_PARAMS = 338_944  # TinyLM at the script's defaults
TOTAL = 20_000  # about 40 s of training on the busy CPU: time to preempt it


@pytest.fixture(scope="module")
def stack(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LiveStack]:
    nodes = asyncio.run(SlurmClient(slurm_cluster.settings(rest=False)).nodes())
    doc = cluster_doc(nodes, "cpu", "slurm-real")
    runs = slurm_cluster.workdir / f"real-runs-{os.getpid()}"
    env = {**slurm_cluster.bridge_env(runs),
           "HOPS_EXECUTOR_BACKEND": "real",
           # torch processes take a second or two to start and exit on 2 busy cores
           "HOPS_PROFILE_ITERS": "5", "HOPS_SAMPLE_S": "0.5", "HOPS_STOP_GRACE_S": "15",
           "HOPS_START_TIMEOUT_S": "60"}
    s = LiveStack(tmp_path_factory.mktemp("slurm-real"), msgspec.json.encode(doc).decode(),
                  schedulers=1, executor="slurm", env=env)
    s.start(timeout=120)
    try:
        yield s
    finally:
        s.stop()
        for job in asyncio.run(SlurmClient(slurm_cluster.settings(rest=False)).jobs()):
            if job.verdict().kind in ("waiting", "running"):
                slurm_cluster.run("scancel", str(job.job_id))


def reports(stack: LiveStack, job: str, server: str) -> list[AnyReport]:
    path = job_paths(Path(stack.env["HOPS_SLURM_RUN_DIR"]), job, server).report
    lines = [decode_line(raw) for raw in path.read_bytes().splitlines()]
    return [line for line in lines if line is not None]


def test_train_cnn_is_profiled_placed_preempted_resumed_and_finishes_under_slurm(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    python = stack.env["HOPS_SLURM_PYTHON"]
    spec: dict[str, Any] = {"id": "cnn", "model": "train_cnn", "batch_size": 8,
                            "params": CNN_PARAMS, "total_samples": TOTAL,
                            "requirements": [1], "base_lr": 0.05,
                            "command": [python, str(CNN)], "workdir": str(ROOT)}
    assert stack.submit(spec)["ok"] is True
    rec, job = running_in_slurm(stack, slurm_cluster, "cnn", timeout=120)
    first, _, _ = planned(rec)
    assert job.nodes == first, (job, first)
    assert f"NodeList={first}" in slurm_cluster.run("scontrol", "show", "job", str(job.job_id))
    profiles = stack.bus_().stored("HOPS_SAMPLES", "hops.v1.profiles.cnn")
    assert profiles and profiles[0]["report"]["batch_size"] == 8, profiles  # the plugin's
    assert len(slurm_jobs(slurm_cluster, "cnn")) >= 2  # the profiling run, then the run
    until(lambda: (stack.record("cnn") or {}).get("samples_done", 0) > 0, "cnn has progress",
          90, stack.logs)
    code, out = hops(stack, "nodes", "drain", first, "--move")
    assert code == 0, out
    try:
        def elsewhere() -> dict[str, Any] | None:
            r = stack.record("cnn") or {}
            return r if r.get("phase") == "running" and planned(r)[0] != first else None
        moved = until(elsewhere, "cnn running on another node", 120, stack.logs)
    finally:
        hops(stack, "nodes", "undrain", first)
    second = planned(moved)[0]
    saved = [r for r in reports(stack, "cnn", first) if isinstance(r, Checkpointed)]
    assert saved and saved[-1].samples_done > 0, reports(stack, "cnn", first)
    phases = stack.wait_final(["cnn"], 240)
    assert phases == {"cnn": "finished"}, stack.logs()
    done = stack.record("cnn") or {}
    assert done["samples_done"] == TOTAL and done["restarts"] >= 1, done
    there = reports(stack, "cnn", second)
    starts = [r for r in there if isinstance(r, Started)]
    assert starts and starts[0].samples_done == saved[-1].samples_done, there  # resumed
    assert [r.samples_done for r in there if isinstance(r, Finished)][-1:] == [TOTAL], there
    assert not stack.bus_().job_events("cnn", "job_failed")
    refused = [e for e in stack.bus_().errors() if e["code"] == "forbidden"]
    assert not refused, refused
    sampled = stack.bus_().messages("hops.v1.samples.", "sample_reported")
    assert "cnn" in {m.body["sample"]["job_id"] for m in sampled}


def test_train_lm_is_profiled_and_finishes_under_slurm(stack: LiveStack,
                                                       slurm_cluster: SlurmCluster) -> None:
    spec: dict[str, Any] = {"id": "lm", "model": "train_lm", "batch_size": 8,
                            "params": LM_PARAMS, "total_samples": 600, "requirements": [1],
                            "base_lr": 0.001, "lr_rule": "sqrt",
                            "command": [stack.env["HOPS_SLURM_PYTHON"], str(LM)],
                            "workdir": str(ROOT)}
    assert stack.submit(spec)["ok"] is True
    assert stack.wait_final(["lm"], 180) == {"lm": "finished"}, stack.logs()
    assert (stack.record("lm") or {})["samples_done"] == 600
    profiles = stack.bus_().stored("HOPS_SAMPLES", "hops.v1.profiles.lm")
    assert profiles and profiles[0]["report"]["batch_size"] == 8, profiles
    started = stack.bus_().job_events("lm", "job_started")[-1].body
    ran = slurm_jobs(slurm_cluster, "lm")
    assert len(ran) >= 2 and ran[-1].nodes == planned(started)[0], ran  # profiled, then run
    assert not stack.bus_().job_events("lm", "job_failed")
