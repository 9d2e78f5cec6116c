"""The Slurm bridge when Slurm does not answer or says no (no Slurm needed):
the codes a start or stop is refused with, the bound on every wait, the
jobs Hops disowned and cancels once Slurm shows them, the one-job reading a
stop polls, the log of a job state Hops does not know, and ``hops up``
honouring Slurm's own ``SLURM_CONF``. Against a real Slurm:
tests/test_slurm_live.py and tests/test_live_slurm.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from cli.up.slurm import slurm_flags
from executor.backend import CommandRefused, Refusal
from executor.slurm.bridge import node_address
from executor.slurm.cli import command_env
from executor.slurm.client import DEFAULT_TIMEOUT_S, SlurmClient, SlurmClusterSettings
from executor.slurm.handle import SlurmJobHandle
from executor.slurm.records import SlurmJob, SlurmNode, decode_nodes, parse_scontrol_job
from executor.slurm.settings import bridge_settings
from executor.slurm.strays import Strays
from executor.slurm.watch import SlurmWatch
from shared.configuration import Configuration
from shared.events import StartJob
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.slurm import SLURM_REFUSED, SLURM_UNAVAILABLE, failure_code, job_name

# What sbatch 22.05 wrote to its standard error for each refusal.
REFUSED = [
    "sbatch exited 1: sbatch: error: Batch job submission failed: Invalid node name specified",
    "sbatch exited 1: sbatch: error: invalid partition specified: nope\n"
    "sbatch: error: Batch job submission failed: Invalid partition name specified",
    "sbatch exited 1: sbatch: error: Batch job submission failed: Invalid generic resource "
    "(gres) specification",
    "sbatch exited 1: sbatch: error: Batch job submission failed: Requested node "
    "configuration is not available",
]
UNREACHABLE = [
    "sbatch exited 1: sbatch: error: Batch job submission failed: Unable to contact slurm "
    "controller (connect failure)",
    "scontrol show exited 1: slurm_load_jobs error: Socket timed out on send/recv operation",
    "squeue --json exited 1: slurm_load_jobs error: Unable to contact slurm controller "
    "(connect failure)",
]


@pytest.mark.parametrize("said", REFUSED)
def test_slurms_refusals_of_a_job_are_slurm_refused(said: str) -> None:
    assert failure_code("slurm_cli_failed", said) == SLURM_REFUSED


@pytest.mark.parametrize("said", UNREACHABLE)
def test_a_slurmctld_out_of_reach_is_slurm_unavailable(said: str) -> None:
    assert failure_code("slurm_cli_failed", said) == SLURM_UNAVAILABLE


@pytest.mark.parametrize("code", ["slurm_cli_timeout", "slurm_cli_missing", "slurm_rest_timeout",
                                  "slurm_rest_unreachable", "slurm_no_reading"])
def test_no_answer_at_all_is_slurm_unavailable(code: str) -> None:
    assert failure_code(code, "whatever it said") == SLURM_UNAVAILABLE


def test_a_job_slurm_would_not_end_keeps_its_own_code() -> None:
    said = "Slurm job 5 still RUNNING 10 s after its SIGKILL"
    assert failure_code("slurm_stop_timeout", said) == "slurm_stop_timeout"


# scontrol show job -d -o 41 on the CI cluster (Slurm 22.05.8), shortened.
SHOWN = ("JobId=41 JobName=hops:sl-1:1795797296967 UserId=hopsrest(998) GroupId=hopsrest(998) "
         "MCS_label=N/A Priority=4294901720 Nice=0 Account=(null) QOS=(null) "
         "JobState=COMPLETED Reason=None Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 "
         "Reboot=0 ExitCode=3:0 RunTime=00:00:01 TimeLimit=UNLIMITED Partition=hops "
         "NodeList=n2 BatchHost=localhost NumNodes=1 NumCPUs=4 NumTasks=1 CPUs/Task=4 "
         "TRES=cpu=4,node=1,billing=4,gres/gpu=2 Command=(null) WorkDir=/tmp/x "
         "TresPerNode=gres:gpu:2 Nodes=n2 CPU_IDs=1-4 Mem=0 GRES=gpu:fake:2(IDX:3-4)\n")


def test_a_job_read_alone_decodes_as_the_json_would() -> None:
    job = parse_scontrol_job(SHOWN)
    assert job is not None
    assert (job.job_id, job.name, job.job_state, job.nodes, job.partition) == (
        41, "hops:sl-1:1795797296967", "COMPLETED", "n2", "hops")
    assert (job.user_name, job.cpus, job.exit_code) == ("hopsrest", 4, 768)
    assert job.gpu_indices == (3, 4)
    verdict = job.verdict()
    assert (verdict.kind, verdict.exit_code) == ("failed", 3)
    killed = parse_scontrol_job(SHOWN.replace("ExitCode=3:0", "ExitCode=0:9")
                                .replace("NodeList=n2", "NodeList=(null)"))
    assert killed is not None and killed.verdict().signal == 9 and killed.nodes == ""
    assert parse_scontrol_job("") is None
    assert parse_scontrol_job("No jobs in the system\n") is None


def slurm_job(job_id: int, name: str, state: str = "RUNNING") -> SlurmJob:
    return SlurmJob(job_id=job_id, name=name, job_state=state, partition="hops", nodes="n1")


def test_a_timed_out_submission_is_cancelled_by_its_name_once_slurm_shows_it() -> None:
    strays = Strays(keep_s=100)
    name = job_name("j1", 1795797296967)
    strays.add_name(name, now=0)
    assert strays.due([], now=1) == []  # Slurm has not shown it (yet)
    shown = [slurm_job(5, name, "PENDING"), slurm_job(6, job_name("j1", 1)),
             slurm_job(7, "wrap")]
    assert [j.job_id for j in strays.due(shown, now=2)] == [5]  # not the job's other start
    strays.cancelled(shown[0])
    assert not strays and strays.due(shown, now=3) == []


def test_a_disowned_id_is_cancelled_only_while_it_names_the_same_job() -> None:
    strays = Strays(keep_s=100)
    strays.add_id(9, "j1", now=0)
    # a slurmctld that lost its state gave id 9 to another job: never touched
    assert strays.due([slurm_job(9, job_name("j2", 3))], now=1) == []
    assert strays.due([slurm_job(9, job_name("j1", 3), "COMPLETED")], now=1) == []  # ended
    assert [j.job_id for j in strays.due([slurm_job(9, job_name("j1", 3))], now=1)] == [9]
    assert strays.due([slurm_job(9, job_name("j1", 3))], now=101) == []  # past its time
    assert not strays


def handle(tmp_path: Path, timeout_s: float) -> SlurmJobHandle:
    """A start's handle whose watch never reads Slurm: a slurmctld that does
    not answer, and a client whose calls fail or time out within ``timeout_s``
    (its slurm.conf is nowhere: scontrol retries for a minute, or is missing)."""
    spec = JobSpec(id=JobId("j"), model="resnet18-cifar10", batch_size=256, params=1,
                   total_samples=100, requirements=(1,))
    cmd = StartJob(key="k", job_id=JobId("j"), server_id=ServerId("n1"), spec=spec,
                   configuration=Configuration.of({ServerId("n1"): 1}), gpu_indices=(0,))
    client = SlurmClient(SlurmClusterSettings(slurm_conf=str(tmp_path / "nowhere.conf"),
                                       timeout_s=timeout_s))
    watch = SlurmWatch(client, 0.1, 1.0, structlog.get_logger())
    return SlurmJobHandle(cmd, 7, tmp_path / "output", 0.0, watch, client,
                          structlog.get_logger(), lambda: None, lambda: None)


def test_a_start_slurm_does_not_answer_is_refused_in_bounded_time(tmp_path: Path) -> None:
    h = handle(tmp_path, timeout_s=0.3)

    async def start_then_stop() -> tuple[str | Refusal | None, float]:
        began = time.monotonic()
        why = await h.started(timeout=30)
        await h.terminate(grace=5)  # a failed start's stop never waits on Slurm
        return why, time.monotonic() - began

    why, took = asyncio.run(start_then_stop())
    assert isinstance(why, Refusal) and why.code == SLURM_UNAVAILABLE, why
    assert "could not be read for 0.3 s" in why.error, why
    assert took < 5, took  # the start's 30 s and the stop's grace were never waited
    # its Slurm job, if Slurm took it, is cancelled once a reading shows it
    assert [j.job_id for j in h.watch.strays.due([slurm_job(7, job_name("j", 1))], 0)] == [7]


def test_a_stop_slurm_does_not_answer_is_refused_and_the_job_kept(tmp_path: Path) -> None:
    h = handle(tmp_path, timeout_s=0.3)
    h.ready = True  # an acknowledged start: it runs for Hops

    async def stop() -> float:
        began = time.monotonic()
        with pytest.raises(CommandRefused) as refused:
            await h.terminate(grace=5)
        assert refused.value.code == SLURM_UNAVAILABLE, refused.value
        assert "could not be stopped" in refused.value.words
        return time.monotonic() - began

    assert asyncio.run(stop()) < 3
    assert not h.watch.strays  # not disowned: it is still Hops' job


def test_an_unknown_job_state_counts_as_running_and_is_logged_once(tmp_path: Path) -> None:
    h = handle(tmp_path, timeout_s=1)
    h.watch.jobs = {7: SlurmJob(job_id=7, name=job_name("j", 1), job_state="LAUNCH_WEIRD",
                                partition="hops", nodes="n1")}
    h.watch.read_at = time.time()
    with capture_logs() as logs:
        assert h._verdict() is None and h._verdict() is None
    said = [e for e in logs if e["event"].startswith("Slurm job state not understood")]
    assert len(said) == 1, logs
    assert said[0]["state"] == "LAUNCH_WEIRD" and said[0]["code"] == "slurm_job_state_unknown"


def test_the_timeout_is_one_setting_with_one_default() -> None:
    assert bridge_settings({}, Path("/r")).slurm.timeout_s == DEFAULT_TIMEOUT_S
    s = bridge_settings({"HOPS_SLURM_TIMEOUT_S": "2.5"}, Path("/r"))
    assert s.slurm.timeout_s == 2.5


def test_slurm_conf_is_found_as_slurms_own_commands_find_it() -> None:
    assert bridge_settings({"SLURM_CONF": "/etc/s.conf"}, Path("/r")).slurm.slurm_conf == \
        "/etc/s.conf"
    assert bridge_settings({}, Path("/r")).slurm.slurm_conf == ""
    assert "SLURM_CONF" not in command_env("")  # the command's own default then
    assert command_env("/etc/s.conf")["SLURM_CONF"] == "/etc/s.conf"


def test_hops_up_honours_a_plain_slurm_conf() -> None:
    env = {"SLURM_CONF": "/etc/slurm/other.conf"}
    assert slurm_flags({"HOPS_SLURM_CONF": ""}, env, slurm=True) == {
        "HOPS_SLURM_CONF": "/etc/slurm/other.conf"}
    assert slurm_flags({"HOPS_SLURM_CONF": "/mine.conf"}, env, slurm=True) == {
        "HOPS_SLURM_CONF": "/mine.conf"}  # the flag (or HOPS_SLURM_CONF) wins
    assert slurm_flags({"HOPS_SLURM_CONF": "", "HOPS_SLURM_USER": "u"}, {}, slurm=True) == {
        "HOPS_SLURM_USER": "u"}
    assert slurm_flags({"HOPS_SLURM_CONF": "/mine.conf"}, env, slurm=False) == {}


def test_a_node_registers_the_address_slurm_reaches_it_at() -> None:
    [n1], _ = decode_nodes(b'{"nodes": [{"name": "n1", "address": "10.0.0.7", '
                           b'"hostname": "gpu7", "partitions": ["hops"]}]}')
    assert node_address(n1, "127.0.0.1") == "10.0.0.7"  # a job's peers meet there
    assert node_address(SlurmNode(name="n2"), "127.0.0.1") == "127.0.0.1"
    assert node_address(None, "10.0.0.1") == "10.0.0.1"
