"""The Slurm client against a real Slurm cluster (deploy/slurm/cluster.sh):
jobs land on the planned node with the planned GPUs and cores, a stop's
SIGTERM reaches the job before the kill, and nodes and jobs that Slurm's
operator changes behind Hops' back read as Hops must see them.

Jobs run as the cluster's REST user in its shared work directory; each test
uses its own nodes or stops what it started.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from executor.slurm.cli import SlurmFailure
from executor.slurm.client import JobRequest, SlurmClient
from executor.slurm.records import SlurmJob
from shared.slurm import names_job
from tests.slurmcluster import SlurmCluster, cancel_all, slurm_cluster

__all__ = ["slurm_cluster"]

TIMEOUT_S = 30.0
T = TypeVar("T")


@pytest.fixture(params=["rest", "cli"])
async def client(request: pytest.FixtureRequest,
                 slurm_cluster: SlurmCluster) -> AsyncIterator[SlurmClient]:
    """The client reading and signalling through slurmrestd, then through
    the CLI alone."""
    c = SlurmClient(slurm_cluster.settings(rest=request.param == "rest"))
    try:
        yield c
    finally:
        await cancel_all(c)


async def until(probe: Callable[[], Awaitable[T | None]], what: str) -> T:
    deadline = time.monotonic() + TIMEOUT_S
    while (value := await probe()) is None or value is False:
        assert time.monotonic() < deadline, f"{what} within {TIMEOUT_S:g} s"
        await asyncio.sleep(0.1)
    return value


def request(cluster: SlurmCluster, name: str, node: str, script: str, *, gpus: int = 1,
            cores: int = 1) -> JobRequest:
    return JobRequest(job_id=name, attempt=0, node=node, gpus=gpus, cores=cores,
                      command=["sh", "-c", script], workdir=str(cluster.workdir),
                      env={"HOPS_JOB": name})


def named(name: str) -> Callable[[SlurmJob], bool]:
    """A stop's check that the id still names the test's job."""
    return lambda job: names_job(job.name, name)


async def running(client: SlurmClient, job_id: int) -> SlurmJob:
    async def probe() -> SlurmJob | None:
        job = await client.job(job_id)
        return job if job is not None and job.job_state == "RUNNING" else None
    return await until(probe, f"job {job_id} running")


async def ended(client: SlurmClient, job_id: int) -> SlurmJob:
    async def probe() -> SlurmJob | None:
        job = await client.job(job_id)
        assert job is not None
        return job if job.verdict().kind not in ("waiting", "running") else None
    return await until(probe, f"job {job_id} ended")


async def file_text(path: Path) -> str:
    async def probe() -> str | None:
        return path.read_text().strip() if path.exists() and path.read_text() else None
    return await until(probe, f"{path} written")


async def resume(client: SlurmClient, cluster: SlurmCluster, node: str) -> None:
    """Resumes ``node`` and waits until it reads idle: for about a second
    after a resume Slurm reads it not responding (``idle*``)."""
    cluster.run("scontrol", "update", f"nodename={node}", "state=resume")

    async def idle() -> bool:
        return any(n.name == node and n.health.code == "idle" for n in await client.nodes())
    await until(idle, f"{node} idle again")


async def test_four_idle_nodes_with_eight_gpus(client: SlurmClient) -> None:
    nodes = await client.nodes()
    assert sorted(n.name for n in nodes) == ["n1", "n2", "n3", "n4"]
    assert all(n.gpus == 8 and n.health.code == "idle" and n.health.alive for n in nodes)


async def test_a_job_runs_on_the_planned_node_gpus_and_cores(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.workdir / f"pinned-{client.rest is not None}"
    script = f'echo "$CUDA_VISIBLE_DEVICES $HOPS_JOB" > {out}; sleep 60'
    job_id = await client.submit(request(slurm_cluster, "pinned", "n3", script, gpus=2, cores=3))
    job = await running(client, job_id)
    assert (job.nodes, job.name, job.cpus) == ("n3", "hops:pinned:0", 3)
    shown = slurm_cluster.run("scontrol", "show", "job", "-d", str(job_id))
    assert re.search(r"\bNodeList=n3\b", shown) and "NumCPUs=3" in shown
    assert re.search(r"Nodes=n3 CPU_IDs=\S+ Mem=\d+ GRES=gpu:fake:2\(IDX:", shown)
    visible, name = (await file_text(out)).split()
    indices = [int(i) for i in visible.split(",")]
    assert name == "pinned" and len(set(indices)) == 2
    assert tuple(indices) == job.gpu_indices


async def test_two_jobs_on_one_node_get_distinct_gpus(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    tag = "rest" if client.rest is not None else "cli"
    outs = [slurm_cluster.workdir / f"share-{tag}-{i}" for i in (1, 2)]
    ids = [await client.submit(request(slurm_cluster, f"share{i}", "n4",
                                       f"echo $CUDA_VISIBLE_DEVICES > {out}; sleep 60", gpus=3))
           for i, out in enumerate(outs)]
    jobs = [await running(client, i) for i in ids]
    seen = [set((await file_text(out)).split(",")) for out in outs]
    assert all(len(s) == 3 for s in seen) and not seen[0] & seen[1]
    assert not set(jobs[0].gpu_indices) & set(jobs[1].gpu_indices)
    [n4] = [n for n in await client.nodes() if n.name == "n4"]
    assert set(n4.gpus_in_use) == set(jobs[0].gpu_indices) | set(jobs[1].gpu_indices)
    assert n4.health.code == "busy"


async def test_a_stop_terms_the_job_before_the_kill(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    tag = "rest" if client.rest is not None else "cli"
    ready, caught = (slurm_cluster.workdir / f"{w}-{tag}" for w in ("ready", "term"))
    script = (f"trap 'echo checkpointed > {caught}; exit 0' TERM; echo up > {ready}; "
              "sleep 60 & wait")
    job_id = await client.submit(request(slurm_cluster, "graceful", "n1", script))
    await running(client, job_id)
    await file_text(ready)
    job = await client.stop(job_id, grace_s=10, mine=named("graceful"))
    assert job is not None and caught.read_text().strip() == "checkpointed"
    # A job that exits 0 on SIGTERM reads COMPLETED: only Hops knows it stopped it.
    assert job.job_state == "COMPLETED"
    assert job.verdict(stopping=True).kind == "stopped"
    assert job.verdict().kind == "finished"


async def test_a_stop_signals_nothing_when_the_id_names_another_job(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    # The id read back names a job the stop is not for (slurmctld gave the
    # id again): the stop must leave that job alone.
    job_id = await client.submit(request(slurm_cluster, "bystander", "n1", "sleep 60"))
    await running(client, job_id)
    try:
        assert await client.stop(job_id, grace_s=1, mine=named("someone-else")) is None
        await asyncio.sleep(1.5)
        job = await client.job(job_id)
        assert job is not None and job.job_state == "RUNNING", job
    finally:
        await client.cancel(job_id)


async def test_a_job_deaf_to_term_is_killed_after_the_grace(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    tag = "rest" if client.rest is not None else "cli"
    ready = slurm_cluster.workdir / f"deaf-{tag}"
    script = f"trap '' TERM; echo up > {ready}; while :; do sleep 0.1; done"
    job_id = await client.submit(request(slurm_cluster, "deaf", "n1", script))
    await running(client, job_id)
    await file_text(ready)
    began = time.monotonic()
    job = await client.stop(job_id, grace_s=2, mine=named("deaf"))
    assert time.monotonic() - began >= 2
    assert job is not None and job.verdict(stopping=True).kind == "stopped"
    assert job.verdict().signal == 9


async def test_a_node_set_down_reads_as_down_with_its_reason(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=test")
    try:
        [n2] = [n for n in await client.nodes() if n.name == "n2"]
        assert (n2.health.alive, n2.health.code, n2.health.reason) == (False, "down", "test")
    finally:
        await resume(client, slurm_cluster, "n2")


async def test_a_drained_node_is_alive_but_takes_no_work(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=maintenance")
    try:
        [n2] = [n for n in await client.nodes() if n.name == "n2"]
        assert (n2.health.alive, n2.health.drained, n2.health.reason) == (True, True,
                                                                          "maintenance")
        job_id = await client.submit(request(slurm_cluster, "blocked", "n2", "true"))
        job = await client.job(job_id)
        assert job is not None and job.verdict().kind == "waiting"
        stopped = await client.stop(job_id, grace_s=5, mine=named("blocked"))
        assert stopped is not None  # a pending job: cancelled
    finally:
        await resume(client, slurm_cluster, "n2")


async def test_a_cancel_behind_hops_back_reads_as_outside(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    job_id = await client.submit(request(slurm_cluster, "victim", "n1", "sleep 60"))
    await running(client, job_id)
    slurm_cluster.run("scancel", str(job_id))
    job = await ended(client, job_id)
    assert job.job_state == "CANCELLED"
    verdict = job.verdict()
    assert (verdict.kind, verdict.code) == ("outside", "slurm_cancelled")


async def test_a_failing_job_reads_as_failed_with_its_exit_code(
        client: SlurmClient, slurm_cluster: SlurmCluster) -> None:
    job = await ended(client, await client.submit(request(slurm_cluster, "bad", "n1", "exit 3")))
    verdict = job.verdict()
    assert (verdict.kind, verdict.exit_code, job.state_reason) == ("failed", 3, "NonZeroExitCode")


async def test_slurmrestd_answers_the_users_token_only(slurm_cluster: SlurmCluster) -> None:
    c = SlurmClient(slurm_cluster.settings(rest=True))
    try:
        assert c.rest is not None and "n1" in {n.name for n in await c.rest.nodes()}
        token = await c.token(60)
    finally:
        await c.aclose()
    url = f"{slurm_cluster.rest_url}/slurm/v0.0.38/ping"
    user = {"X-SLURM-USER-NAME": slurm_cluster.rest_user}
    async with httpx.AsyncClient() as http:
        assert (await http.get(url, headers={**user, "X-SLURM-USER-TOKEN": token})
                ).status_code == 200
        assert (await http.get(url, headers=user)).status_code == 401
        # slurmrestd hands a token on unchecked; slurmctld refuses a forged
        # one, which comes back as a 500.
        forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        assert (await http.get(f"{slurm_cluster.rest_url}/slurm/v0.0.38/jobs",
                               headers={**user, "X-SLURM-USER-TOKEN": forged})
                ).status_code == 500


async def test_a_refused_token_is_renewed_once(slurm_cluster: SlurmCluster) -> None:
    c = SlurmClient(slurm_cluster.settings(rest=True))
    try:
        assert c.rest is not None
        good = await c.token(600)
        c.rest._token, c.rest._renew_at = good[:-4] + "AAAA", time.monotonic() + 600
        assert len(await c.nodes()) == 4
        assert c.rest._token != good[:-4] + "AAAA"
    finally:
        await c.aclose()


async def test_a_refused_operation_says_why(slurm_cluster: SlurmCluster) -> None:
    c = SlurmClient(slurm_cluster.settings(rest=False))
    try:
        with pytest.raises(SlurmFailure) as refused:
            await c.submit(request(slurm_cluster, "nowhere", "n9", "true"))
    finally:
        await c.aclose()
    assert refused.value.code == "slurm_cli_failed"
    assert "Invalid node name" in refused.value.error
