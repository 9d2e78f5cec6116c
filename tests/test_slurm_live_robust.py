"""The Slurm bridge against a real Slurm (tests/slurmcluster.py) that says no
or does not answer: sbatch's refusals are ``slurm_refused`` with Slurm's
words; with slurmctld stopped (SIGSTOP: it holds its connections and
answers nothing, as a hung controller does) a start is refused
``slurm_unavailable`` within the timeout, a stop too, and the job a
timed-out sbatch submitted is cancelled once slurmctld answers again, so
no Slurm job runs that Hops does not know of; a stop's reading of its one
job is the job the full listing shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
import structlog

from executor.backend import CommandRefused
from executor.slurm.backend import JobEnv, SlurmBackend
from executor.slurm.cli import SlurmFailure
from executor.slurm.client import JobRequest, SlurmClient
from executor.slurm.nodes import slurm_cluster as cluster_of
from executor.slurm.settings import BridgeSettings
from executor.slurm.watch import SlurmWatch
from shared.configuration import Configuration
from shared.events import StartJob
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.slurm import (
    SLURM_REFUSED,
    SLURM_UNAVAILABLE,
    failure_code,
    names_job,
    parse_job_name,
)
from tests.slurmcluster import SlurmCluster, cancel_all, node_python, slurm_cluster
from world.catalog import builtin_catalog
from world.truth import GroundTruth

__all__ = ["slurm_cluster"]

TIMEOUT_S = 2.0  # the bridge's Slurm timeout in these tests


def request(cluster: SlurmCluster, name: str, node: str = "n1", gpus: int = 1,
            script: str = "sleep 60") -> JobRequest:
    return JobRequest(job_id=name, attempt=int(time.time() * 1000), node=node, gpus=gpus,
                      cores=1, command=["sh", "-c", script], workdir=str(cluster.workdir))


@pytest.fixture
async def client(slurm_cluster: SlurmCluster) -> AsyncIterator[SlurmClient]:
    c = SlurmClient(msgspec.structs.replace(slurm_cluster.settings(rest=False),
                                            timeout_s=TIMEOUT_S))
    try:
        yield c
    finally:
        await cancel_all(c)


@contextlib.contextmanager
def stopped(cluster: SlurmCluster) -> Iterator[int]:
    """slurmctld stopped (SIGSTOP) within, continued (SIGCONT) after, whatever
    happened."""
    pid = int((cluster.directory / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize(("change", "said"), [
    ({"node": "n9"}, "Invalid node name"),
    ({"gpus": 99}, "Requested node configuration is not available"),
])
async def test_sbatchs_refusals_are_slurm_refused_in_slurms_words(
        client: SlurmClient, slurm_cluster: SlurmCluster, change: dict[str, object],
        said: str) -> None:
    req = msgspec.structs.replace(request(slurm_cluster, "refused"), **change)
    with pytest.raises(SlurmFailure) as failed:
        await client.submit(req)
    assert failure_code(failed.value.code, failed.value.error) == SLURM_REFUSED
    assert said in failed.value.error, failed.value.error


async def test_a_job_read_alone_is_the_job_the_listing_shows(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    job_id = await client.submit(request(slurm_cluster, "alone", script="exit 3"))
    deadline = time.monotonic() + 30
    while (one := await client.job(job_id)) is None or one.verdict().kind in ("waiting",
                                                                            "running"):
        assert time.monotonic() < deadline, one
        await asyncio.sleep(0.2)
    [listed] = [j for j in await client.jobs() if j.job_id == job_id]
    assert (one.name, one.job_state, one.nodes, one.partition, one.exit_code, one.cpus) == (
        listed.name, listed.job_state, listed.nodes, listed.partition, listed.exit_code,
        listed.cpus), (one, listed)
    assert one.verdict().exit_code == 3
    assert await client.job(99_999_999) is None  # never known: None, not a failure


def backend(cluster: SlurmCluster, client: SlurmClient, watch: SlurmWatch,
            runs: Path) -> SlurmBackend:
    hops_cluster = cluster_of(list(watch.nodes.values()), "TitanXP")
    python, path = node_python(cluster.rest_user)
    settings = BridgeSettings(slurm=client.settings, run_dir=runs, python=python,
                              pythonpath=path)
    env = JobEnv(nats_url="nats://127.0.0.1:9", job_args=[], cluster=str(runs / "none"))
    return SlurmBackend(hops_cluster.by_id[ServerId("n2")], settings, client, watch, env,
                        GroundTruth(hops_cluster, builtin_catalog()), structlog.get_logger())


def start(job: str) -> StartJob:
    spec = JobSpec(id=JobId(job), model="resnet18-cifar10", batch_size=256, params=1,
                   total_samples=10**9, requirements=(1,))
    return StartJob(key=f"k-{job}", job_id=JobId(job), server_id=ServerId("n2"), spec=spec,
                    configuration=Configuration.of({ServerId("n2"): 1}), gpu_indices=(0,))


async def test_a_start_slurmctld_does_not_answer_is_refused_and_its_job_cancelled(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    """sbatch sends its request to a stopped slurmctld, which takes it once it
    is continued: the submission happened, though sbatch gave up. The
    bridge's watch finds the job by its name and cancels it."""
    watch = SlurmWatch(client, 0.2, 3.0, structlog.get_logger())
    await watch.read()  # the nodes
    runs = slurm_cluster.workdir / f"robust-{os.getpid()}"
    runs.mkdir(exist_ok=True)
    user = pwd.getpwnam(slurm_cluster.rest_user)
    os.chown(runs, user.pw_uid, user.pw_gid)
    b = backend(slurm_cluster, client, watch, runs)
    with stopped(slurm_cluster):
        began = time.monotonic()
        with pytest.raises(CommandRefused) as refused:
            await b.spawn(start("stray"), lambda: None)
        took = time.monotonic() - began
    assert refused.value.code == SLURM_UNAVAILABLE, refused.value
    assert f"did not answer within {TIMEOUT_S:g} s" in refused.value.words, refused.value
    assert took < TIMEOUT_S + 3, took
    assert len(watch.strays) == 1
    stopping = asyncio.Event()
    reader = asyncio.create_task(watch.run(stopping))
    try:
        deadline = time.monotonic() + 20
        while True:
            mine = [j for j in await client.jobs()
                    if (p := parse_job_name(j.name)) is not None and p[0] == "stray"]
            if mine and all(j.verdict().kind not in ("waiting", "running") for j in mine) \
                    and not watch.strays:
                break
            assert time.monotonic() < deadline, (mine, len(watch.strays))
            await asyncio.sleep(0.2)
    finally:
        stopping.set()
        await reader
    # slurmctld took the request sbatch gave up on, and the bridge cancelled the job
    assert [j.job_state for j in mine] == ["CANCELLED"], mine


async def test_a_stop_slurmctld_does_not_answer_is_refused_within_the_timeout(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    job_id = await client.submit(request(slurm_cluster, "kept", node="n3"))
    with stopped(slurm_cluster):
        began = time.monotonic()
        with pytest.raises(SlurmFailure) as failed:
            await client.stop(job_id, grace_s=5, mine=lambda job: names_job(job.name, "kept"))
        took = time.monotonic() - began
    assert failure_code(failed.value.code, failed.value.error) == SLURM_UNAVAILABLE
    assert took < TIMEOUT_S + 1, took
    job = await client.job(job_id)  # untouched: Hops keeps it booked
    assert job is not None and job.verdict().kind in ("waiting", "running"), job
