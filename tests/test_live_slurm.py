"""Hops decides, Slurm executes: the live stack with the Slurm bridge
(``python -m executor.slurm``, as ``hops up --backend slurm`` runs it) over
the real Slurm cluster of tests/slurmcluster.py (four nodes, eight fake
GPUs each).

First, ``hops up --backend slurm``'s description of the cluster from
Slurm's nodes. Then one stack serves the module's tests, in order: a job profiled and run to
its last sample as Slurm jobs; a running job's Slurm job on the planned
node with the planned GPUs and cores (the scheduler runs the test layer
that gives every run 2 cores per GPU, tests/cores_layer.py); a job
cancelled with ``scancel`` behind Hops' back, reported and not restarted;
a node set DOWN in Slurm, shown dead and its job requeued with its
progress; the bridge killed with SIGKILL and started again, adopting the
job Slurm still runs and requeuing the one Slurm no longer runs; slurmctld
killed with SIGKILL and started again, each job running exactly once; the
placer killed with SIGKILL while it starts a job in Slurm and started
again, the job it started adopted by the new placer, every job finishing and
none ever running twice in Slurm.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cli.up.slurm import SlurmUpError, describe
from cli.up.stack import StackConfig
from executor.slurm.client import SlurmClient
from executor.slurm.nodes import cluster_doc
from executor.slurm.records import SlurmJob
from shared.slurm import parse_job_name
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until
from tests.slurmcluster import (
    SlurmCluster,
    planned,
    slurm_cluster,
    slurm_jobs,
    slurm_jobs_all,
)
from world.clusters import cluster_arg

__all__ = ["slurm_cluster"]

NEVER = 10**13  # samples: a job that runs until something stops it
SHORT = 10_000_000  # a few seconds at x600
CORES_PER_GPU = 2
HEARTBEAT_TIMEOUT_S = 3.0  # the monitor's
DOWN_S = 2.0  # the bridge's debounce of a dead node in this test


@pytest.fixture(scope="module")
def stack(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LiveStack]:
    nodes = asyncio.run(SlurmClient(slurm_cluster.settings(rest=False)).nodes())
    doc = cluster_doc(nodes, "TitanXP", "slurm-test")
    runs = slurm_cluster.workdir / f"runs-{os.getpid()}"
    env = {**slurm_cluster.bridge_env(runs),
           "HOPS_SLURM_DOWN_S": str(DOWN_S), "HOPS_TEST_CORES_PER_GPU": str(CORES_PER_GPU)}
    s = LiveStack(tmp_path_factory.mktemp("slurm"), msgspec.json.encode(doc).decode(),
                  schedulers=1, executor="slurm", env=env,
                  modules={"scheduler": "tests.cores_layer"})
    s.start(timeout=120)
    try:
        yield s
    finally:
        s.stop()
        for job in slurm_jobs_all(slurm_cluster):
            if job.verdict().kind in ("waiting", "running"):
                subprocess.run(["scancel", str(job.job_id)], env=slurm_cluster.env(),
                               check=False)


def running_in_slurm(stack: LiveStack, cluster: SlurmCluster, job_id: str,
                     timeout: float = 60.0) -> tuple[dict[str, Any], SlurmJob]:
    """The job's record once it runs, and its run's Slurm job, running."""
    def probe() -> tuple[dict[str, Any], SlurmJob] | None:
        rec = stack.record(job_id)
        if not rec or rec["phase"] != "running":
            return None
        runs = [j for j in slurm_jobs(cluster, job_id) if j.job_state == "RUNNING"]
        return (rec, runs[-1]) if runs else None
    return until(probe, f"{job_id} running in Slurm", timeout, stack.logs)


def test_hops_up_describes_the_cluster_from_slurms_nodes(slurm_cluster: SlurmCluster,
                                                         tmp_path: Path) -> None:
    config = StackConfig(executor="slurm", data_dir=tmp_path, slurm={
        "HOPS_SLURM_CONF": slurm_cluster.slurm_conf, "HOPS_SLURM_GPU_TYPE": "TitanXP"})
    described = describe(config)
    cluster = cluster_arg(described.cluster)
    assert [(s.id, s.gpus, s.cores, s.gpu_type) for s in cluster.servers] == [
        (f"n{i}", 8, 16, "TitanXP") for i in range(1, 5)]
    with pytest.raises(SlurmUpError, match="partition has no nodes"):
        describe(StackConfig(executor="slurm", data_dir=tmp_path, slurm={
            "HOPS_SLURM_CONF": slurm_cluster.slurm_conf, "HOPS_SLURM_PARTITION": "other"}))


def test_a_job_is_profiled_and_runs_to_its_last_sample_as_slurm_jobs(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    stack.submit(catalog_spec("sl-short", SHORT, requirements=[1, 2]))
    phases = stack.wait_final(["sl-short"], 120)
    assert phases == {"sl-short": "finished"}, stack.logs()
    rec = stack.record("sl-short")
    assert rec is not None and rec["samples_done"] == rec["spec"]["total_samples"]
    profiles = stack.bus_().stored("HOPS_SAMPLES", "hops.v1.profiles.sl-short")
    assert {p["report"]["gpu_type"] for p in profiles} == {"TitanXP"}
    def ended() -> list[SlurmJob] | None:  # the process exits just after it says so
        jobs = slurm_jobs(slurm_cluster, "sl-short")
        return jobs if jobs[-1].verdict().kind not in ("waiting", "running") else None
    ran = until(ended, "sl-short's last Slurm job ended", 15)
    # at least the profiling run and the run; an earlier run may have been
    # stopped by a later plan (a SIGTERM: COMPLETED, or FAILED by the signal)
    assert len(ran) >= 2, ran
    assert (ran[-1].job_state, ran[-1].exit_code) == ("COMPLETED", 0), ran
    assert not stack.bus_().job_events("sl-short", "job_failed")
    started = stack.bus_().job_events("sl-short", "job_started")[-1].body
    server, _, _ = planned(started)
    assert ran[-1].nodes == server, (ran[-1], server)
    refused = [e for e in stack.bus_().errors() if e["code"] == "forbidden"]
    assert not refused, refused


def test_a_running_job_holds_the_planned_node_gpus_and_cores_in_slurm(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    stack.submit(catalog_spec("sl-long", NEVER, requirements=[2]))
    rec, job = running_in_slurm(stack, slurm_cluster, "sl-long")
    server, gpus, cores = planned(rec)
    assert (gpus, cores) == (2, 2 * CORES_PER_GPU), rec["configuration"]
    assert job.nodes == server and job.cpus == cores, job
    assert len(job.gpu_indices) == gpus, job
    shown = slurm_cluster.run("scontrol", "show", "job", str(job.job_id))
    assert f"NodeList={server}" in shown and f"NumCPUs={cores}" in shown, shown
    assert f"TresPerNode=gres:gpu:{gpus}" in shown, shown


def test_a_job_cancelled_behind_hops_back_fails_with_the_reason(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    stack.submit(catalog_spec("sl-outside", NEVER, requirements=[1]))
    _, job = running_in_slurm(stack, slurm_cluster, "sl-outside")
    slurm_cluster.run("scancel", str(job.job_id))
    until(lambda: stack.phase("sl-outside") == "failed", "sl-outside failed", 30, stack.logs)
    reason = stack.record("sl-outside")["reason"]  # type: ignore[index]
    assert reason.startswith("slurm_cancelled:") and "outside Hops" in reason, reason
    time.sleep(2 * stack.round_s)  # rounds pass: nothing starts it again
    assert [j.job_id for j in slurm_jobs(slurm_cluster, "sl-outside")] == [job.job_id]
    assert stack.phase("sl-outside") == "failed"


def test_a_node_set_down_is_dead_and_its_job_requeued_with_its_progress(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    _, job = running_in_slurm(stack, slurm_cluster, "sl-long")
    server = job.nodes
    until(lambda: (stack.record("sl-long") or {}).get("samples_done", 0) > 0,
          "sl-long has progress", 30, stack.logs)
    slurm_cluster.run("scontrol", "update", f"nodename={server}", "state=down",
                      "reason=test")
    try:
        until(lambda: stack.nodes()[server]["alive"] is False, f"{server} dead in Hops",
              DOWN_S + HEARTBEAT_TIMEOUT_S + 10, stack.logs)
        shown = subprocess.run([sys.executable, "-m", "cli.main", "nodes", "--json"],
                               capture_output=True, text=True, check=False,
                               env={**os.environ, "HOPS_GATEWAY_URL": stack.config.gateway_url,
                                    "HOPS_TOKEN": stack.admin_token})
        assert shown.returncode == 0, shown.stderr
        listed = msgspec.json.decode(shown.stdout)
        dead = [s for s in listed["servers"] if s["id"] == server]
        assert dead and dead[0]["alive"] is False, dead

        def elsewhere() -> dict[str, Any] | None:
            r = stack.record("sl-long") or {}
            if r.get("phase") != "running" or planned(r)[0] == server:
                return None
            return r
        moved = until(elsewhere, "sl-long running on another node", 60, stack.logs)
        assert moved["restarts"] >= 1
        assert moved["samples_done"] > 0  # its progress came along
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={server}", "state=resume")
    until(lambda: stack.nodes()[server]["alive"] is True, f"{server} back", 30, stack.logs)


def test_a_restarted_bridge_adopts_what_slurm_runs_and_requeues_what_it_lost(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    """Behind the killed bridge's back, one job goes on running in Slurm and
    Slurm forgets the other (its record then names a job Slurm does not
    know, as once MinJobAge has passed, or after slurmctld lost its state)."""
    _, kept = running_in_slurm(stack, slurm_cluster, "sl-long")
    stack.submit(catalog_spec("sl-lost", NEVER, requirements=[1]))
    lost_rec, lost = running_in_slurm(stack, slurm_cluster, "sl-lost")
    until(lambda: (stack.record("sl-lost") or {}).get("samples_done", 0) > 0,
          "sl-lost has progress", 30, stack.logs)
    long_restarts = stack.record("sl-long")["restarts"]  # type: ignore[index]
    bridge = stack.procs["cluster"]
    bridge.proc.send_signal(signal.SIGKILL)
    bridge.proc.wait(10)
    slurm_cluster.run("scancel", str(lost.job_id))
    runs = Path(stack.env["HOPS_SLURM_RUN_DIR"])
    record = runs / "sl-lost" / f"slurm-{lost.nodes}" / "record.json"
    record.write_bytes(record.read_bytes().replace(str(lost.job_id).encode(), b"99999999"))
    restarts = lost_rec["restarts"]
    stack.procs["cluster"] = stack.launcher.start(bridge.component)

    def requeued() -> dict[str, Any] | None:
        r = stack.record("sl-lost") or {}
        return r if r.get("phase") == "running" and r["restarts"] > restarts else None
    again = until(requeued, "sl-lost requeued and running again", 60, stack.logs)
    assert again["samples_done"] > 0  # from its progress
    assert stack.record("sl-long")["phase"] == "running"  # type: ignore[index]
    long_runs = [j for j in slurm_jobs(slurm_cluster, "sl-long") if j.job_state == "RUNNING"]
    assert [j.job_id for j in long_runs] == [kept.job_id], long_runs  # adopted, not twice
    assert stack.record("sl-long")["restarts"] == long_restarts  # type: ignore[index]


def job_processes(job_id: str) -> int:
    """How many ``executor.job`` processes of ``job_id`` run on this host."""
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"executor.job" in argv and job_id.encode() in argv:
            count += 1
    return count


def test_slurmctld_killed_and_restarted_loses_nothing(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    """While slurmctld is gone the bridge keeps its last reading: nothing is
    judged on a Slurm it cannot read, and no node is lost. The restarted
    slurmctld recovers the jobs its state saved, and Hops goes on with the
    same Slurm jobs; a job submitted just before the kill may not have been
    saved: Slurm then no longer knows it, and Hops requeues it with its
    progress. Either way every job runs once.

    The kill waits until slurmctld saved the running jobs: one killed before
    that forgets a job whose slurmd still runs it, hands its id to the next
    sbatch, and drains the node when the slurmd reports the two as one id
    ("Duplicate jobid"), which is Slurm's loss, not one Hops can mend."""
    slurm = {job: running_in_slurm(stack, slurm_cluster, job)[1]
             for job in ("sl-long", "sl-lost")}
    running = {job: s.job_id for job, s in slurm.items()}
    state = slurm_cluster.directory / "state" / "job_state"
    until(lambda: state.exists()
          and all(s.name.encode() in state.read_bytes() for s in slurm.values()),
          "slurmctld saved the running jobs", 30, stack.logs)
    before = {job: stack.record(job) or {} for job in running}
    pid_file = slurm_cluster.directory / "run" / "slurmctld.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    time.sleep(2 * HEARTBEAT_TIMEOUT_S)  # longer than the monitor waits for a heartbeat
    assert all(n["alive"] for n in stack.nodes().values()), stack.nodes()
    assert all(stack.phase(job) == "running" for job in running)
    subprocess.run(["slurmctld"], env=slurm_cluster.env(), check=True, timeout=30)

    def settled() -> bool:
        return all(stack.phase(job) == "running" and job_processes(job) == 1
                   and len([j for j in slurm_jobs(slurm_cluster, job)
                            if j.job_state == "RUNNING"]) == 1 for job in running)
    until(settled, "each job running once in Slurm", 60, stack.logs)
    for job, slurm_id in running.items():
        rec = stack.record(job) or {}
        now = [j.job_id for j in slurm_jobs(slurm_cluster, job) if j.job_state == "RUNNING"]
        if rec["restarts"] == before[job]["restarts"]:  # recovered by slurmctld: adopted
            assert now == [slurm_id], (job, now, slurm_id)
        else:  # lost with slurmctld: requeued from its progress (its new Slurm job may
            # even have the lost one's id: a slurmctld that lost jobs counts from its state)
            assert rec["restarts"] == before[job]["restarts"] + 1, (job, rec)
            assert rec["samples_done"] >= before[job]["samples_done"] > 0, (job, rec)
    until(lambda: all(n["alive"] for n in stack.nodes().values()), "every node alive", 15)


def running_twice(cluster: SlurmCluster) -> dict[str, list[int]]:
    """The Hops jobs with more than one RUNNING Slurm job, with their ids."""
    by_job: dict[str, list[int]] = {}
    for job in slurm_jobs_all(cluster):
        parsed = parse_job_name(job.name)
        if parsed and job.job_state == "RUNNING":
            by_job.setdefault(parsed[0], []).append(job.job_id)
    return {job: ids for job, ids in by_job.items() if len(ids) > 1}


def test_the_placer_killed_mid_run_loses_nothing_and_runs_no_job_twice(
        stack: LiveStack, slurm_cluster: SlurmCluster) -> None:
    """The placer killed with SIGKILL while it starts a job in Slurm (its
    Slurm job submitted, its ack not yet in), a job submitted while it is
    away, and a new placer: the running job keeps its Slurm job, nothing
    starts while no placer runs, every job finishes with every sample, and
    no Hops job ever has two Slurm jobs running."""
    stack.submit(catalog_spec("sl-keep", NEVER, requirements=[1]))
    _, kept = running_in_slurm(stack, slurm_cluster, "sl-keep")
    keep_restarts = stack.record("sl-keep")["restarts"]  # type: ignore[index]
    batch = ["sl-p1", "sl-p2"]
    for job in batch:
        stack.submit(catalog_spec(job, 3 * SHORT, requirements=[1]))
    until(lambda: slurm_jobs(slurm_cluster, "sl-p1"), "sl-p1 submitted to Slurm", 60,
          stack.logs)
    placer = stack.procs["placer"]
    placer.proc.send_signal(signal.SIGKILL)  # mid-start: its ack not yet in
    placer.proc.wait(10)
    stack.submit(catalog_spec("sl-p3", 3 * SHORT, requirements=[1]))
    time.sleep(2 * stack.round_s)  # rounds pass with their plans unapplied
    assert not slurm_jobs(slurm_cluster, "sl-p3"), "started without a placer"
    assert not running_twice(slurm_cluster)
    restarted = time.monotonic()  # the bus's clock
    stack.procs["placer"] = stack.launcher.start(placer.component)
    jobs = [*batch, "sl-p3"]

    def ended() -> dict[str, str] | None:
        twice = running_twice(slurm_cluster)
        assert not twice, twice  # at every reading, not only at the end
        assert all(job_processes(job) <= 1 for job in jobs), "a job runs twice on the host"
        phases = {job: stack.phase(job) for job in jobs}
        return phases if all(p in ("finished", "failed") for p in phases.values()) else None
    phases = until(ended, "the jobs ended", 180, stack.logs)
    assert phases == dict.fromkeys(jobs, "finished"), (phases, stack.logs())
    for job in jobs:
        rec = stack.record(job) or {}
        assert rec["samples_done"] == rec["spec"]["total_samples"], rec
        assert not stack.bus_().job_events(job, "job_failed")
    # what the dead placer had started is adopted by the new one, not refused
    # round after round ("already runs") until the monitor stops it as an orphan.
    # (A plan made before the adoption was known may still put sl-p3 on a GPU
    # an adopted job holds: the bridge refuses that start, "conflict", and a
    # later plan starts it; counted above, it runs once.)
    refused = [e for e in stack.bus_().errors(since=restarted) if e.get("code") == "start_failed"
               and any(str(e.get("error", "")).startswith(f"job {j} ") for j in batch)]
    assert not refused, refused
    starts = {job: (stack.record(job) or {}).get("restarts") for job in jobs}
    assert starts == dict.fromkeys(jobs, 1), starts  # restarts counts the first start
    keep = stack.record("sl-keep") or {}
    assert (keep["phase"], keep["restarts"]) == ("running", keep_restarts), keep
    running = [j.job_id for j in slurm_jobs(slurm_cluster, "sl-keep") if j.job_state == "RUNNING"]
    assert running == [kept.job_id], running  # the same Slurm job throughout
