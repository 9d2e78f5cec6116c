"""A real job over two Slurm nodes: the live stack with the Slurm bridge
running real jobs (``HOPS_EXECUTOR_BACKEND=real``) over the real cluster of
tests/slurmcluster.py, each node described to Hops with one GPU, so that a
job of two GPUs is placed on two servers.

``examples/train_cnn.py`` (PyTorch on the CPU, DistributedDataParallel over
gloo) is profiled, then placed on two nodes: one Slurm job on each planned
node (``scontrol show job``), rank 0 on the first, rank 1 on the second,
meeting at the first node's address as Slurm names it (``NodeAddr``, the
rendezvous the bridge registers for the node) on the port the placer draws
for the start; the job finishes with every sample, no report refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from executor.slurm.client import SlurmClient
from executor.slurm.nodes import cluster_doc
from shared.configuration import Configuration
from tests.livestack import LiveStack, until
from tests.slurmcluster import SlurmCluster, slurm_cluster
from tests.test_live_slurm import slurm_jobs
from tests.test_live_slurm_real import CNN, CNN_PARAMS, real_stack, reports, submit

__all__ = ["slurm_cluster"]

TOTAL = 6_000  # two ranks of 8: about 20 s of training on the busy CPU


@pytest.fixture(scope="module")
def stack(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LiveStack]:
    nodes = asyncio.run(SlurmClient(slurm_cluster.settings(rest=False)).nodes())
    doc = cluster_doc(nodes, "cpu", "slurm-two")
    for server in doc["servers"]:
        server["gpus"] = 1  # one process each: a 2-GPU job needs two nodes
    yield from real_stack(slurm_cluster, tmp_path_factory.mktemp("slurm-two"), doc, "two-runs")


def test_a_real_job_over_two_slurm_nodes_runs_on_both_and_finishes(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    submit(stack, "two", CNN, CNN_PARAMS, TOTAL, requirements=[2], base_lr=0.05)

    def on_two() -> tuple[dict[str, Any], list[Any]] | None:
        rec = stack.record("two") or {}
        if rec.get("phase") != "running":
            return None
        servers = msgspec.convert(rec["configuration"], Configuration).servers
        runs = [j for j in slurm_jobs(slurm_cluster, "two") if j.job_state == "RUNNING"]
        return (rec, runs) if len(servers) == 2 and len(runs) == 2 else None
    rec, runs = until(on_two, "two running as two Slurm jobs", 180, stack.logs)
    planned = list(msgspec.convert(rec["configuration"], Configuration).servers)
    assert sorted(j.nodes for j in runs) == sorted(planned), (runs, planned)
    for job in runs:
        shown = slurm_cluster.run("scontrol", "show", "job", str(job.job_id))
        assert f"NodeList={job.nodes}" in shown and "TresPerNode=gres:gpu:1" in shown, shown
    phases = stack.wait_final(["two"], 300)
    assert phases == {"two": "finished"}, stack.logs()
    done = stack.record("two") or {}
    assert done["samples_done"] == TOTAL, done
    assert not stack.bus_().job_events("two", "job_failed")
    refused = [e for e in stack.bus_().errors() if e["code"] in ("forbidden", "start_failed")]
    assert not refused, refused
    # both ranks trained: each node's report file has the run's start
    for server in planned:
        assert any(type(r).__name__ == "Started" for r in reports(stack, "two", server)), server
