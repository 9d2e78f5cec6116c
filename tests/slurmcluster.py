"""A real Slurm cluster for the tests (issue 37): deploy/slurm/cluster.sh's
munge, slurmctld, four slurmd (n1..n4, eight fake GPUs each) and slurmrestd,
started once per session under the session's temporary directory and
stopped at its end.

Import the fixture into a test module: ``from tests.slurmcluster import
slurm_cluster``. Without Slurm's programs, or without root (slurmd and
``mknod`` need it), the tests are skipped with the reason, and fail under
``CI=true`` (:func:`tests.engines.require`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cli.up.launcher import port_free
from executor.slurm.client import SlurmClient, SlurmClusterSettings
from executor.slurm.records import SlurmJob
from shared.configuration import Configuration
from shared.ids import ServerId
from shared.slurm import parse_job_name
from tests.engines import require

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy" / "slurm" / "cluster.sh"
PROGRAMS = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm",
            "munged": "munge", "slurmrestd": "slurmrestd", "setpriv": "util-linux"}
# cluster.sh takes this port and the next ten.
PORT_SPAN = 11


@dataclass(frozen=True)
class SlurmCluster:
    """The running cluster: its state directory, ``SLURM_CONF``, slurmrestd's
    URL and the user it serves, and the partition Hops owns."""

    directory: Path
    slurm_conf: str
    rest_url: str
    rest_user: str
    partition: str
    workdir: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.slurm_conf}

    def run(self, *argv: str) -> str:
        """A Slurm command's output (``scontrol``, ``scancel``…) on this
        cluster; it must succeed."""
        done = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=30, check=False)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr or done.stdout}"
        return done.stdout

    def settings(self, *, rest: bool) -> SlurmClusterSettings:
        """The client's settings: acting as the REST user, through slurmrestd
        or through the CLI alone."""
        return SlurmClusterSettings(slurm_conf=self.slurm_conf, partition=self.partition,
                             user=self.rest_user, rest_url=self.rest_url if rest else "")

    def bridge_env(self, runs: Path) -> dict[str, str]:
        """The Slurm bridge's settings for this cluster (executor.slurm.settings),
        its jobs' files under ``runs``, run by a Python the Slurm user can run."""
        python, path = node_python(self.rest_user)
        return {"HOPS_SLURM_CONF": self.slurm_conf, "HOPS_SLURM_PARTITION": self.partition,
                "HOPS_SLURM_USER": self.rest_user, "HOPS_SLURM_REST_URL": self.rest_url,
                "HOPS_SLURM_RUN_DIR": str(runs), "HOPS_SLURM_PYTHON": python,
                "HOPS_SLURM_PYTHONPATH": path}


def slurm_jobs_all(cluster: SlurmCluster) -> list[SlurmJob]:
    """Every job of the partition Slurm knows (through the CLI)."""
    async def read() -> list[SlurmJob]:
        client = SlurmClient(cluster.settings(rest=False))
        try:
            return await client.jobs()
        finally:
            await client.aclose()

    return asyncio.run(read())


def slurm_jobs(cluster: SlurmCluster, job_id: str) -> list[SlurmJob]:
    """The Slurm jobs of Hops job ``job_id``, oldest first."""
    mine = [j for j in slurm_jobs_all(cluster)
            if (parsed := parse_job_name(j.name)) and parsed[0] == job_id]
    return sorted(mine, key=lambda j: j.job_id)


def planned(rec: dict[str, Any]) -> tuple[ServerId, int, int]:
    """The (server, GPUs, cores) of a one-server job's placement."""
    config = msgspec.convert(rec["configuration"], Configuration)
    server = config.servers[0]
    demand = config.demand_on(server)
    return server, demand.gpus, demand.cores


async def cancel_all(client: SlurmClient) -> None:
    """Cancel every job of the partition still pending or running, then
    close ``client`` (a test's own client, at its end)."""
    try:
        for job in await client.jobs():
            if job.verdict().kind in ("waiting", "running"):
                await client.cancel(job.job_id)
    finally:
        await client.aclose()


def slurm_missing() -> str:
    """Why the cluster cannot run here ('' when it can)."""
    absent = sorted({pkg for prog, pkg in PROGRAMS.items() if shutil.which(prog) is None})
    if absent:
        return f"no Slurm here (apt-get install {' '.join(absent)})"
    if os.geteuid() != 0:
        return "not root: slurmd and mknod need root"
    return ""


def node_python(user: str) -> tuple[str, str]:
    """The interpreter the Slurm user can run (this one, or the system's
    Python of the same version with this one's packages) and the
    PYTHONPATH it needs."""
    probe = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c",
                            "import msgspec"], capture_output=True, check=False)
    if probe.returncode == 0:
        return sys.executable, ""
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    return system, sysconfig.get_paths()["purelib"]


def free_base_port() -> int:
    """A port with its next ten free too (one probe: a race is unlikely and
    cluster.sh says so if it loses one)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        if base + PORT_SPAN < 65536 and all(port_free(base + i) for i in range(PORT_SPAN)):
            return base
    raise RuntimeError("no run of free ports for the Slurm cluster")


def _script(action: str, env: dict[str, str]) -> str:
    done = subprocess.run([str(SCRIPT), action], env=env, capture_output=True, text=True,
                          timeout=90, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cluster.sh {action} failed: {done.stderr[-2000:]}")
    return done.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    why = slurm_missing()
    require("Slurm", not why, why)
    # Not under pytest's own directory: slurmrestd and the jobs run as
    # another user, who cannot enter it.
    directory = Path(tempfile.mkdtemp(prefix="hops-slurm-"))
    env = {**os.environ, "HOPS_SLURM_DIR": str(directory),
           "HOPS_SLURM_PORT": str(free_base_port())}
    _script("start", env)
    try:
        values = dict(line.split("=", 1) for line in _script("env", env).splitlines())
        yield SlurmCluster(directory=directory, slurm_conf=values["SLURM_CONF"],
                           rest_url=values["HOPS_SLURM_REST_URL"],
                           rest_user=values["HOPS_SLURM_REST_USER"],
                           partition=values["HOPS_SLURM_PARTITION"],
                           workdir=Path(values["HOPS_SLURM_WORKDIR"]))
    finally:
        _script("stop", env)
        shutil.rmtree(directory, ignore_errors=True)
