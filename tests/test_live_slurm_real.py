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
``examples/train_lm.py`` goes the same way: profiled, placed, preempted,
resumed and finished with every sample.
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
LM_TOTAL = 12_000  # about 350 sequences a second alone here: some 35 s of training


def real_stack(cluster: SlurmCluster, root: Path, doc: dict[str, Any], runs: str
               ) -> Iterator[LiveStack]:
    """The live stack with the bridge running real jobs over ``cluster``
    described as ``doc``, their files under ``runs`` in its work folder."""
    env = {**cluster.bridge_env(cluster.workdir / f"{runs}-{os.getpid()}"),
           "HOPS_EXECUTOR_BACKEND": "real",
           # torch processes take a second or two to start and exit on 2 busy cores
           "HOPS_PROFILE_ITERS": "5", "HOPS_SAMPLE_S": "0.5", "HOPS_STOP_GRACE_S": "15",
           "HOPS_START_TIMEOUT_S": "60"}
    s = LiveStack(root, msgspec.json.encode(doc).decode(), schedulers=1, executor="slurm",
                  env=env)
    s.start(timeout=120)
    try:
        yield s
    finally:
        s.stop()
        for job in asyncio.run(SlurmClient(cluster.settings(rest=False)).jobs()):
            if job.verdict().kind in ("waiting", "running"):
                cluster.run("scancel", str(job.job_id))


@pytest.fixture(scope="module")
def stack(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LiveStack]:
    nodes = asyncio.run(SlurmClient(slurm_cluster.settings(rest=False)).nodes())
    yield from real_stack(slurm_cluster, tmp_path_factory.mktemp("slurm-real"),
                          cluster_doc(nodes, "cpu", "slurm-real"), "real-runs")


def reports(stack: LiveStack, job: str, server: str) -> list[AnyReport]:
    path = job_paths(Path(stack.env["HOPS_SLURM_RUN_DIR"]), job, server).report
    lines = [decode_line(raw) for raw in path.read_bytes().splitlines()]
    return [line for line in lines if line is not None]


def submit(stack: LiveStack, job: str, script: Path, params: int, total: int,
           **extra: Any) -> None:
    spec: dict[str, Any] = {"id": job, "model": script.stem, "batch_size": 8,
                            "params": params, "total_samples": total, "requirements": [1],
                            "command": [stack.env["HOPS_SLURM_PYTHON"], str(script)],
                            "workdir": str(ROOT), **extra}
    assert stack.submit(spec)["ok"] is True


def preempted_resumed_finished(stack: LiveStack, slurm_cluster: SlurmCluster, job: str,
                               total: int) -> None:
    """``job`` profiled as a Slurm job, run on the planned node, preempted
    with a checkpoint (its node drained with ``--move``), resumed on another
    node from the checkpoint, finished with every sample, its reports
    published by the bridge with no report refused."""
    rec, ran = running_in_slurm(stack, slurm_cluster, job, timeout=120)
    first, _, _ = planned(rec)
    assert ran.nodes == first, (ran, first)
    assert f"NodeList={first}" in slurm_cluster.run("scontrol", "show", "job", str(ran.job_id))
    profiles = stack.bus_().stored("HOPS_SAMPLES", f"hops.v1.profiles.{job}")
    assert profiles and profiles[0]["report"]["batch_size"] == 8, profiles  # the plugin's
    assert len(slurm_jobs(slurm_cluster, job)) >= 2  # the profiling run, then the run
    until(lambda: (stack.record(job) or {}).get("samples_done", 0) > 0, f"{job} has progress",
          90, stack.logs)
    code, out = hops(stack, "nodes", "drain", first, "--move")
    assert code == 0, out
    try:
        def elsewhere() -> dict[str, Any] | None:
            r = stack.record(job) or {}
            return r if r.get("phase") == "running" and planned(r)[0] != first else None
        moved = until(elsewhere, f"{job} running on another node", 120, stack.logs)
    finally:
        hops(stack, "nodes", "undrain", first)
    second = planned(moved)[0]
    saved = [r for r in reports(stack, job, first) if isinstance(r, Checkpointed)]
    assert saved and saved[-1].samples_done > 0, reports(stack, job, first)
    phases = stack.wait_final([job], 240)
    assert phases == {job: "finished"}, stack.logs()
    done = stack.record(job) or {}
    assert done["samples_done"] == total and done["restarts"] >= 1, done
    there = reports(stack, job, second)
    starts = [r for r in there if isinstance(r, Started)]
    assert starts and starts[0].samples_done == saved[-1].samples_done, there  # resumed
    # Under load the job may be moved once more before it ends (a node judged
    # lost): its one Finished report, with every sample, is on the node it
    # ended on, whichever that is.
    ends = {s: [r.samples_done for r in reports(stack, job, s) if isinstance(r, Finished)]
            for s in stack.nodes()
            if job_paths(Path(stack.env["HOPS_SLURM_RUN_DIR"]), job, s).report.exists()}
    assert [n for done in ends.values() for n in done] == [total], (ends, there)
    assert not stack.bus_().job_events(job, "job_failed")
    refused = [e for e in stack.bus_().errors() if e["code"] == "forbidden"]
    assert not refused, refused
    sampled = stack.bus_().messages("hops.v1.samples.", "sample_reported")
    assert job in {m.body["sample"]["job_id"] for m in sampled}


def test_train_cnn_is_profiled_placed_preempted_resumed_and_finishes_under_slurm(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    submit(stack, "cnn", CNN, CNN_PARAMS, TOTAL, base_lr=0.05)
    preempted_resumed_finished(stack, slurm_cluster, "cnn", TOTAL)


def test_train_lm_is_profiled_placed_preempted_resumed_and_finishes_under_slurm(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    submit(stack, "lm", LM, LM_PARAMS, LM_TOTAL, base_lr=0.001, lr_rule="sqrt")
    preempted_resumed_finished(stack, slurm_cluster, "lm", LM_TOTAL)
