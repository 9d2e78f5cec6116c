"""Plan-to-running and stop latency of Hops' starts under the Slurm bridge
against Hops' own (emulated) executors, p50/p99 over ``--starts`` each.

Measured where the placer feels it: the bench stands in for the placer and
sends ``start_job`` and ``stop_job`` on ``hops.v1.exec.<server>.commands``,
as the placer does (the same request, the same ack), to the stack ``hops
up`` runs (monitor, estimator, profiler, the cluster process, gateway; no
scheduler and no placer, so no plan interferes):

* a start: from the ``start_job`` sent to its ack. The placer writes the
  job's ``hops_alloc`` entry and publishes ``job_started`` on that ack, so
  this is plan-to-running as Hops records it, less the placer's own
  bookkeeping (the same under both backends). Under Slurm the ack waits
  for the job's first heartbeat inside its Slurm job; under an executor,
  for the emulated job process's;
* a stop: from the ``stop_job`` sent to its ack, which comes once the job
  has ended (under Slurm: SIGTERM through Slurm, the job read ended).

The cluster is Slurm's four nodes (deploy/slurm/cluster.sh, started here in
a temporary directory, eight fake GPUs each) for both backends. Starts go
in rounds of 16 jobs of one GPU, four per node, one after the other; then
the round's jobs are stopped one after the other.

    .venv/bin/python bench/slurm_latency.py [--starts 100] [--backend both]

Needs root and Debian's slurm-wlm, slurmrestd and munge. Prints a table;
nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from bench.live_stack import client_settings, config_in, start_stack
from bench.slurm_start import pct
from executor.slurm.client import SlurmClient, SlurmClusterSettings
from executor.slurm.nodes import cluster_doc
from services.runtime.bus import connect, request
from shared import subjects
from shared.configuration import Configuration
from shared.events import CommandAck, StartJob, StopJob, decode_ack
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from tests.slurmcluster import SCRIPT, free_base_port, node_python, slurm_missing
from world.catalog import builtin_catalog

ROUND = 16  # jobs a round: four per node, one GPU each
NAMES = ("monitor", "estimator", "profiler", "cluster", "gateway")
MODEL = "resnet18-cifar10"


def spec(job: str) -> JobSpec:
    truth = builtin_catalog()[MODEL]
    return JobSpec(JobId(job), MODEL, truth.batch_size, truth.params, 10**13, requirements=(1,))


async def command(nc: NATS, server: ServerId, cmd: StartJob | StopJob) -> tuple[float, CommandAck]:
    """(seconds to the ack, the ack)."""
    began = time.monotonic()
    ack = await request(nc, subjects.exec_commands(server), cmd, decode_ack, timeout=60)
    return time.monotonic() - began, ack


async def wait_served(nc: NATS, servers: list[ServerId], timeout: float = 90) -> None:
    """Until every server's executor answers (a stop of no job: ``not_found``)."""
    deadline = time.monotonic() + timeout
    for server in servers:
        while True:
            try:
                await command(nc, server, StopJob(key=f"probe-{server}", job_id=JobId("none")))
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the executor of {server} never answered") from None
                await asyncio.sleep(0.2)


async def measure(url: str, servers: list[ServerId], starts: int,
                  tag: str) -> dict[str, list[float]]:
    nc = await connect(client_settings(url), "bench-placer")
    took: dict[str, list[float]] = {"start": [], "stop": []}
    try:
        await wait_served(nc, servers)
        done = 0
        while done < starts:
            round_jobs: list[tuple[ServerId, JobId]] = []
            for k in range(min(ROUND, starts - done)):
                server, job = servers[k % len(servers)], JobId(f"{tag}-{done + k}")
                cmd = StartJob(key=f"start:{job}@{server}", job_id=job, server_id=server,
                               spec=spec(job), configuration=Configuration.of({server: 1}),
                               gpu_indices=(k // len(servers),))
                seconds, ack = await command(nc, server, cmd)
                if not ack.ok:
                    raise RuntimeError(f"start of {job} on {server} refused: {ack.code} "
                                       f"{ack.error}")
                took["start"].append(seconds)
                round_jobs.append((server, job))
            for server, job in round_jobs:
                seconds, ack = await command(nc, server, StopJob(key=f"stop:{job}@{server}",
                                                                 job_id=job, reason="bench"))
                if not ack.ok:
                    raise RuntimeError(f"stop of {job} refused: {ack.code} {ack.error}")
                took["stop"].append(seconds)
            done += len(round_jobs)
    finally:
        await nc.close()
    return took


def slurm_env(values: dict[str, str], runs: Path) -> dict[str, str]:
    """The bridge's settings for the bench's cluster (docs/slurm.md)."""
    python, path = node_python(values["HOPS_SLURM_REST_USER"])
    return {"HOPS_SLURM_CONF": values["SLURM_CONF"], "HOPS_SLURM_USER":
            values["HOPS_SLURM_REST_USER"], "HOPS_SLURM_REST_URL": values["HOPS_SLURM_REST_URL"],
            "HOPS_SLURM_RUN_DIR": str(runs), "HOPS_SLURM_PYTHON": python,
            "HOPS_SLURM_PYTHONPATH": path, "HOPS_SLURM_GPU_TYPE": "TitanXP"}


def run_backend(backend: str, values: dict[str, str], cluster: Path,
                starts: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix=f"hops-lat-{backend}-") as tmp:
        extra: dict[str, object] = {}
        if backend == "slurm":
            runs = Path(values["HOPS_SLURM_WORKDIR"]) / f"bench-runs-{os.getpid()}"
            extra["slurm"] = slurm_env(values, runs)
        config = config_in(tmp, cluster=str(cluster), executor=backend, **extra)
        nats, launcher = start_stack(config, NAMES)
        try:
            servers = [ServerId(n) for n in ("n1", "n2", "n3", "n4")]
            return asyncio.run(measure(nats.url, servers, starts, f"lat-{backend}"))
        finally:
            launcher.stop()
            nats.stop()


def report(results: dict[str, dict[str, list[float]]], starts: int) -> None:
    print(f"{starts} starts and stops each, one GPU each, rounds of {ROUND}")
    print(f"{'':22} {'p50 (s)':>8} {'p99 (s)':>8} {'max (s)':>8}")
    for backend, took in results.items():
        for what, seconds in took.items():
            print(f"{what + ', ' + backend:22} {pct(seconds, 50):8.3f} "
                  f"{pct(seconds, 99):8.3f} {max(seconds):8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=100)
    parser.add_argument("--backend", choices=("both", "slurm", "emulated"), default="both")
    args = parser.parse_args()
    if why := slurm_missing():
        sys.exit(f"cannot run: {why}")
    os.environ["HOPS_ORPHAN_GRACE_S"] = "3600"  # the bench's jobs have no hops_alloc entry
    directory = Path(tempfile.mkdtemp(prefix="hops-slurm-lat-"))
    env = {**os.environ, "HOPS_SLURM_DIR": str(directory),
           "HOPS_SLURM_PORT": str(free_base_port())}
    subprocess.run([str(SCRIPT), "start"], env=env, check=True)
    try:
        values = dict(line.split("=", 1) for line in subprocess.run(
            [str(SCRIPT), "env"], env=env, capture_output=True, text=True, check=True
        ).stdout.splitlines())
        settings = SlurmClusterSettings(slurm_conf=values["SLURM_CONF"])
        nodes = asyncio.run(SlurmClient(settings).nodes())
        cluster = directory / "cluster.json"
        cluster.write_bytes(msgspec.json.encode(cluster_doc(nodes, "TitanXP", "slurm-bench")))
        backends = ("emulated", "slurm") if args.backend == "both" else (args.backend,)
        results = {b: run_backend(b, values, cluster, args.starts) for b in backends}
        report(results, args.starts)
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
