"""deploy/compose.slurm.yaml run for real (issue 37): compose.yaml with the
Slurm bridge as its ``cluster`` service, on a real Docker engine
(:mod:`tests.composestack`, the Hops image tag of tests/test_compose_live.py),
over the real Slurm cluster of :mod:`tests.slurmcluster` (four nodes, eight
fake GPUs each, its own folder and ports, which the override's variables
name).

The bridge's container runs as the Slurm user, not root: it reaches
slurmctld and slurmrestd on the host's network, munged through the socket
of the cluster's munge folder, and shares the run folder with the nodes at
the same path; the jobs it submits run on the host's slurmd and reach
compose's NATS on its published port. One deployment serves the module's
tests, in order: every service healthy, the bridge serving the four nodes as
the Slurm user; a job submitted through the gateway profiled and run as
Slurm batch jobs of Hops' partition, on the planned node with the planned
GPUs and cores (``scontrol show job``), finished with every sample. ``down
-v`` at the end, whatever happened. Without Docker or Slurm the module
skips, saying which (a failure under ``CI=true``).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor.slurm.records import SlurmJob
from tests.composestack import (
    ROOT,
    SHORT,
    SLURM_IMAGE,
    Deployment,
    deployed,
    record,
    slurm_override,
    submit,
    wait_finished,
)
from tests.livestack import until
from tests.slurmcluster import SlurmCluster, planned, slurm_cluster, slurm_jobs

__all__ = ["slurm_cluster"]

REPLICAS = {"scheduler": 2}  # compose.yaml's deploy.replicas
CI_CLUSTER = ROOT / "deploy" / "slurm" / "cluster-ci.yaml"
NODES = ["n1", "n2", "n3", "n4"]
LONG = SHORT * 4  # long enough to be seen running
SIGTERM_STATUS = 15  # Slurm's exit code is a wait status: killed by signal 15


def slurm_env(d: Deployment, cluster: SlurmCluster) -> dict[str, str]:
    """The override's variables for ``cluster`` (docs/slurm.md, "Compose"),
    with a run folder of this deployment's, owned by the Slurm user."""
    user = pwd.getpwnam(cluster.rest_user)
    runs = cluster.workdir / f"compose-{d.project}"
    runs.mkdir()
    os.chown(runs, user.pw_uid, user.pw_gid)
    bridge = cluster.bridge_env(runs)
    # the jobs run on the host's nodes: Hops from this tree, not the image's /app
    path = ":".join(p for p in (str(ROOT), bridge["HOPS_SLURM_PYTHONPATH"]) if p)
    return {**bridge, "HOPS_SLURM_PYTHONPATH": path,
            "HOPS_SLURM_ETC": str(Path(cluster.slurm_conf).parent),
            "HOPS_MUNGE_DIR": str(cluster.directory / "munge"),
            "HOPS_SLURM_UID": str(user.pw_uid), "HOPS_SLURM_GID": str(user.pw_gid),
            "HOPS_SLURM_NATS_URL": d.nats_url, "HOPS_SLURM_CLUSTER": str(CI_CLUSTER)}


@pytest.fixture(scope="module")
def deployment(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Deployment]:
    def prepare(d: Deployment) -> None:
        d.credentials(str(CI_CLUSTER))  # the nodes' seeds, beside the paper cluster's
        d.env = slurm_env(d, slurm_cluster)
        d.compose("build", "monitor")  # the Hops image: Dockerfile.slurm starts FROM it

    with deployed(tmp_path_factory.mktemp("compose-slurm"), REPLICAS,
                  overrides={"compose.slurm.yaml": slurm_override()}, prepare=prepare) as d:
        yield d


def running(d: Deployment, cluster: SlurmCluster, job_id: str
            ) -> tuple[dict[str, Any], SlurmJob]:
    """The job's record while it runs (with its placement), and its run's
    Slurm job, running."""
    def probe() -> tuple[dict[str, Any], SlurmJob] | None:
        rec = record(d, job_id)
        if rec["phase"] != "running" or not rec.get("configuration"):
            return None
        runs = [j for j in slurm_jobs(cluster, job_id) if j.job_state == "RUNNING"]
        return (rec, runs[-1]) if runs else None
    return until(probe, f"{job_id} running in Slurm", 120, lambda: d.logs("cluster"))


def test_every_service_becomes_healthy_and_the_bridge_serves_the_slurm_nodes(
        deployment: Deployment, slurm_cluster: SlurmCluster) -> None:
    assert deployment.unhealthy(REPLICAS) == {}
    (bridge,) = deployment.containers("cluster")
    shown = deployment.docker("inspect", "--format", "{{.Config.Image}} {{.Config.User}}",
                              bridge).split()
    user = pwd.getpwnam(slurm_cluster.rest_user)
    assert shown == [SLURM_IMAGE, f"{user.pw_uid}:{user.pw_gid}"], shown
    assert "Slurm bridge serving" in deployment.compose("logs", "--no-color", "cluster")
    with deployment.http() as api:
        servers = api.get("/cluster").json()["servers"]
    assert sorted((s["id"], s["gpu_type"], s["gpus"], s["alive"]) for s in servers) == [
        (n, "TitanXP", 8, True) for n in NODES], servers


def test_a_job_through_the_gateway_runs_as_slurm_jobs_on_the_planned_node(
        deployment: Deployment, slurm_cluster: SlurmCluster) -> None:
    submit(deployment, "cs-run", LONG)
    rec, job = running(deployment, slurm_cluster, "cs-run")
    server, gpus, cores = planned(rec)
    assert (job.nodes, job.partition, job.cpus) == (server, "hops", max(1, cores)), job
    assert job.user_name == slurm_cluster.rest_user and len(job.gpu_indices) == gpus, job
    shown = slurm_cluster.run("scontrol", "show", "job", str(job.job_id))
    assert f"NodeList={server}" in shown and "Partition=hops" in shown, shown
    assert f"TresPerNode=gres:gpu:{gpus}" in shown, shown
    wait_finished(deployment, ["cs-run"], 240)
    assert record(deployment, "cs-run")["samples_done"] == LONG

    def ended() -> list[SlurmJob] | None:  # the process exits just after it says so
        jobs = slurm_jobs(slurm_cluster, "cs-run")
        return jobs if jobs[-1].verdict().kind not in ("waiting", "running") else None
    ran = until(ended, "cs-run's last Slurm job ended", 15)
    # the profiling run (a short Slurm job of its own), then the run
    assert len(ran) >= 2 and {j.partition for j in ran} == {"hops"}, ran
    # The run ends by itself, or by the SIGTERM of the placer's stop that
    # follows its finish when that reaches it between its last report and
    # its exit (docs/slurm.md, "Quirks"): never otherwise.
    assert ran[-1].nodes == server and (ran[-1].job_state, ran[-1].exit_code) in (
        ("COMPLETED", 0), ("FAILED", SIGTERM_STATUS)), ran
    print(f"\ncompose over Slurm: cs-run as Slurm jobs "
          f"{[(j.job_id, j.nodes, j.job_state) for j in ran]}, planned {server}")
