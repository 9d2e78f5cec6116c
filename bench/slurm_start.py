"""How long Slurm takes from ``sbatch`` to the job's process running, and
from a stop's SIGTERM to the job's end, on the CI's one-host Slurm cluster
(deploy/slurm/cluster.sh, started here in a temporary directory).

Two ways a start meets the cluster:

* ``free``: the planned node has room (earlier jobs keep running on it);
* ``after stop``: the planned node's last job was just stopped, as when Hops
  preempts a job and starts another in its place.

The start is timed from the call to ``sbatch`` to the moment the job's
own process writes its clock (one host: the same clock); the stop from the
SIGTERM to Slurm reading the job ended.

    .venv/bin/python bench/slurm_start.py [--jobs 30] [--rest]

Needs root and Debian's slurm-wlm, slurmrestd and munge. Prints a table;
nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.slurm.client import JobRequest, SlurmClient, SlurmClusterSettings
from executor.slurm.records import SlurmJob
from shared.slurm import names_job
from tests.slurmcluster import SCRIPT, free_base_port, slurm_missing

NODES = ("n1", "n2", "n3", "n4")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def started_at(path: Path, timeout_s: float = 60.0) -> float:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not written within {timeout_s:g} s")
        await asyncio.sleep(0.005)
    return float(path.read_text())


async def start_one(client: SlurmClient, work: Path, name: str, node: str) -> tuple[int, float]:
    """(Slurm job id, seconds from sbatch to the job's process running)."""
    clock = work / name
    req = JobRequest(job_id=name, attempt=0, node=node, gpus=1, cores=1,
                     command=["sh", "-c", f"date +%s.%N > {clock}; exec sleep 600"],
                     workdir=str(work))
    began = time.time()
    job_id = await client.submit(req)
    return job_id, await started_at(clock) - began


async def measure(client: SlurmClient, work: Path, jobs: int) -> dict[str, list[float]]:
    free: list[float] = []
    after: list[float] = []
    stops: list[float] = []
    running: list[int] = []
    for i in range(jobs):
        job_id, seconds = await start_one(client, work, f"free{i}", NODES[i % len(NODES)])
        free.append(seconds)
        running.append(job_id)
    for job_id in running:
        await client.cancel(job_id)
    for i in range(jobs):
        node = NODES[i % len(NODES)]
        job_id, seconds = await start_one(client, work, f"after{i}", node)
        after.append(seconds)
        began = time.monotonic()
        await client.stop(job_id, grace_s=30, mine=functools.partial(is_named, f"after{i}"))
        stops.append(time.monotonic() - began)
    return {"start, node free": free, "start, after a stop": after, "stop (TERM to ended)": stops}


def is_named(name: str, job: SlurmJob) -> bool:
    """A stop's check that the id still names the bench's job ``name``."""
    return names_job(job.name, name)


async def run(jobs: int, rest: bool, env: dict[str, str]) -> None:
    values = dict(line.split("=", 1) for line in subprocess.run(
        [str(SCRIPT), "env"], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines())
    client = SlurmClient(SlurmClusterSettings(
        slurm_conf=values["SLURM_CONF"], user=values["HOPS_SLURM_REST_USER"],
        rest_url=values["HOPS_SLURM_REST_URL"] if rest else ""))
    try:
        results = await measure(client, Path(values["HOPS_SLURM_WORKDIR"]), jobs)
    finally:
        await client.aclose()
    print(f"Slurm 22.05, one host, {jobs} jobs each, reads through "
          f"{'slurmrestd' if rest else 'the CLI'}")
    print(f"{'':24} {'p50 (s)':>8} {'p99 (s)':>8} {'max (s)':>8}")
    for what, seconds in results.items():
        print(f"{what:24} {pct(seconds, 50):8.3f} {pct(seconds, 99):8.3f} {max(seconds):8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--rest", action="store_true", help="read and signal through slurmrestd")
    args = parser.parse_args()
    if not 0 < args.jobs <= 32:
        sys.exit("--jobs: 1 to 32 (the free starts all run at once, one GPU each, on 4x8 GPUs)")
    if why := slurm_missing():
        sys.exit(f"cannot run: {why}")
    directory = Path(tempfile.mkdtemp(prefix="hops-slurm-bench-"))
    env = {**os.environ, "HOPS_SLURM_DIR": str(directory),
           "HOPS_SLURM_PORT": str(free_base_port())}
    subprocess.run([str(SCRIPT), "start"], env=env, check=True)
    try:
        asyncio.run(run(args.jobs, args.rest, env))
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
