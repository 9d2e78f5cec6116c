"""The Slurm bridge's pure parts (no Slurm needed): its settings, the
cluster Slurm's nodes describe, what ``hops up --backend slurm`` runs, and
how a start's end in Slurm becomes what Hops publishes (a real job's too). The bridge against
a real Slurm is tests/test_live_slurm.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
import structlog

from cli.up.stack import StackConfig, by_name
from executor.launch import LaunchOptions, job_paths
from executor.slurm.client import SlurmClient, SlurmClusterSettings
from executor.slurm.handle import SlurmJobHandle
from executor.slurm.nodes import cluster_doc, gres_type, slurm_cluster
from executor.slurm.realjobs import RealJobs, SlurmRealHandle
from executor.slurm.records import SlurmNode
from executor.slurm.settings import BridgeSettingsError, bridge_settings
from executor.slurm.watch import SlurmWatch
from scheduling.rounds import ROUND_S
from shared.configuration import Configuration
from shared.events import JobFailed, JobFinished, Report, SampleReported, StartJob
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.jobreport import Checkpointed, Finished, ReportLine, Started
from shared.slurm import JOB_GONE, STOPPED_OUTSIDE, JobVerdict
from shared.specs import SpecError


def node(name: str, gres: str = "gpu:fake:8", cpus: int = 16) -> SlurmNode:
    return SlurmNode(name=name, gres=gres, cpus=cpus, partitions=["hops"])


def test_settings_come_from_the_environment_and_bad_ones_are_named() -> None:
    s = bridge_settings({"SLURM_CONF": "/etc/slurm.conf", "HOPS_SLURM_USER": "hopsrest",
                         "HOPS_SLURM_POLL_S": "0.25"}, Path("/runs"))
    assert (s.slurm.slurm_conf, s.slurm.partition, s.slurm.user) == ("/etc/slurm.conf", "hops",
                                                                     "hopsrest")
    assert (s.run_dir, s.poll_s, s.slurm.rest_url) == (Path("/runs"), 0.25, "")
    with pytest.raises(BridgeSettingsError, match="HOPS_SLURM_DOWN_S"):
        bridge_settings({"HOPS_SLURM_CONF": "x", "HOPS_SLURM_DOWN_S": "-1"}, Path("/runs"))


def test_the_cluster_is_slurms_nodes_with_the_type_the_operator_names() -> None:
    assert gres_type("gpu:fake:8") == "fake" and gres_type("gpu:8") == ""
    cluster = slurm_cluster([node("n1"), node("n2", "gpu:fake:4", 8)], "TitanXP")
    assert [(s.id, s.gpu_type, s.gpus, s.cores) for s in cluster.servers] == [
        ("n1", "TitanXP", 8, 16), ("n2", "TitanXP", 4, 8)]
    # a type the built-in clusters know keeps their communication model
    assert cluster.gpu_types[0].link_bandwidth == 1.25e9
    assert slurm_cluster([node("n1")], "").servers[0].gpu_type == "fake"
    with pytest.raises(SpecError, match="HOPS_SLURM_GPU_TYPE"):
        cluster_doc([node("n1", "gpu:8")], "")
    with pytest.raises(SpecError, match="no nodes"):
        cluster_doc([], "TitanXP")


def test_hops_up_runs_the_bridge_for_the_slurm_backend() -> None:
    config = StackConfig(executor="slurm", slurm={"HOPS_SLURM_CONF": "/etc/slurm.conf"})
    bridge = by_name(config)["cluster"]
    assert bridge.module == "executor.slurm" and "--all" not in bridge.args
    assert bridge.env["HOPS_SLURM_CONF"] == "/etc/slurm.conf"
    assert bridge.env["HOPS_NATS_CREDENTIALS_DIR"].endswith("credentials")
    with pytest.raises(ValueError, match="--backend slurm"):
        StackConfig(slurm={"HOPS_SLURM_CONF": "x"})
    assert "--backend" not in bridge.args  # emulated jobs, at the stack's time scale
    assert config.round_wall_s == StackConfig().round_wall_s


def test_hops_up_slurm_jobs_real_runs_real_jobs_in_real_time() -> None:
    config = StackConfig(executor="slurm", slurm_jobs="real")
    assert by_name(config)["cluster"].args[-2:] == ("--backend", "real")
    assert config.round_wall_s == StackConfig(executor="real").round_wall_s == ROUND_S
    with pytest.raises(ValueError, match="--backend slurm"):
        StackConfig(slurm_jobs="real")
    with pytest.raises(ValueError, match="emulated or real, got 'fake'"):
        StackConfig(executor="slurm", slurm_jobs="fake")


def handle(tmp_path: Path, lines: str) -> tuple[SlurmJobHandle, list[str]]:
    spec = JobSpec(id=JobId("j"), model="resnet18-cifar10", batch_size=256, params=1,
                   total_samples=100, requirements=(1,))
    cmd = StartJob(key="k", job_id=JobId("j"), server_id=ServerId("n1"), spec=spec,
                   configuration=Configuration.of({ServerId("n1"): 1}), gpu_indices=(0,))
    (tmp_path / "output").write_text(lines)
    lost: list[str] = []
    client = SlurmClient(SlurmClusterSettings(slurm_conf="/nowhere"))
    watch = SlurmWatch(client, 1.0, 1.0, structlog.get_logger())
    h = SlurmJobHandle(cmd, 7, tmp_path / "output", 0.0, watch, client, structlog.get_logger(),
                       lambda: None, lambda: lost.append("j"))
    h.read_output()
    return h, lost


def test_an_end_outside_hops_fails_the_job_with_its_code(tmp_path: Path) -> None:
    h, lost = handle(tmp_path, '{"event": "ready", "samples_done": 5}\nnot json\n')
    assert h.ready and h.samples_done == 5
    out = h._outcome(JobVerdict(kind="outside", code="slurm_cancelled",
                                reason="Slurm: CANCELLED outside Hops"))
    assert isinstance(out.event, JobFailed) and out.event.reason.startswith("slurm_cancelled:")
    # a job that exited 0 without finishing was stopped by someone else
    out = h._outcome(JobVerdict(kind="finished", code="slurm_completed", exit_code=0))
    assert isinstance(out.event, JobFailed)
    assert out.event.reason.startswith(STOPPED_OUTSIDE), out.event.reason
    assert not lost


def test_a_job_slurm_lost_is_listed_lost_and_a_finished_one_says_nothing(
        tmp_path: Path) -> None:
    h, lost = handle(tmp_path, '{"event": "ready", "samples_done": 5}\n'
                               '{"event": "finished", "samples_done": 100}\n')
    assert h._outcome(JobVerdict(kind="finished", code="slurm_completed")).event is None
    assert h._outcome(JobVerdict(kind="requeue", code=JOB_GONE)).event is None
    assert lost == ["j"]
    asyncio.run(h.client.aclose())


class NoSink:
    """The runs below report no sample or profile: nothing is published."""

    async def sample(self, msg: SampleReported) -> None:
        raise AssertionError(msg)

    def event(self, job_id: str, msg: Report, msg_id: str) -> None:
        raise AssertionError(msg)


def real_handle(tmp_path: Path, output: str, report: list[ReportLine]) -> SlurmRealHandle:
    tmp_path.mkdir()
    h, _ = handle(tmp_path, "")
    paths = job_paths(tmp_path, "j", ServerId("n1"))
    paths.report.parent.mkdir(parents=True)
    paths.report.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in report))
    (tmp_path / "output").write_text(output)
    real = RealJobs(sink=NoSink(), options=LaunchOptions(gpu_type="cpu"), base_env={},
                    stop_grace_s=1.0)
    r = SlurmRealHandle(h.cmd, 7, tmp_path / "output", 0.0, h.watch, h.client,
                        structlog.get_logger(), lambda: None, lambda: None,
                        paths=paths, offset=0, real=real)
    asyncio.run(r.take_in())
    return r


def test_a_real_jobs_end_is_judged_from_its_processes_and_reports(tmp_path: Path) -> None:
    ready = '{"event": "ready", "samples_done": 0}\n'
    stopped = real_handle(tmp_path / "a", ready + '{"event": "exited", "samples_done": 0, '
                          '"exits": {"0": 0}}\n', [Started(), Checkpointed(samples_done=40)])
    stopped.stopping = True  # Hops' stop: the ack carries the checkpoint's progress
    assert stopped.ready and stopped.samples_done == 40
    assert stopped._outcome(JobVerdict(kind="stopped", code="slurm_stopped")).event is None
    failed = real_handle(tmp_path / "b", ready + '{"event": "exited", "samples_done": 0, '
                         '"exits": {"0": 3}}\n', [Started()])
    out = failed._outcome(JobVerdict(kind="finished", code="slurm_completed", exit_code=0))
    assert isinstance(out.event, JobFailed) and out.event.exit_code == 3, out
    done = real_handle(tmp_path / "c", ready + '{"event": "exited", "samples_done": 0, '
                       '"exits": {"0": 0}}\n', [Started(), Finished(samples_done=100)])
    out = done._outcome(JobVerdict(kind="finished", code="slurm_completed", exit_code=0))
    assert isinstance(out.event, JobFinished) and done.last_event == "finished", out


def test_hops_up_refuses_slurm_jobs_without_the_slurm_backend(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["up", "--data-dir", str(tmp_path), "--slurm-jobs", "real"])
    assert result.exit_code == 2, result.output
    assert "Slurm settings are for the Slurm backend (--backend slurm)" in result.output
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_hops_up_says_which_jobs_the_bridge_runs_and_runs_those() -> None:
    from cli.up.slurm import slurm_jobs_of
    from cli.up.stack import environment
    from cli.up.up import banner

    real_env = {"HOPS_EXECUTOR_BACKEND": "real"}
    assert slurm_jobs_of("", {}, slurm=True) == "emulated"
    assert slurm_jobs_of("", real_env, slurm=True) == "real"  # as the bridge would read it
    assert slurm_jobs_of("emulated", real_env, slurm=True) == "emulated"  # the flag wins
    assert slurm_jobs_of("", real_env, slurm=False) == "emulated"  # the executors' variable
    real = StackConfig(executor="slurm", slurm_jobs=slurm_jobs_of("", real_env, slurm=True))
    assert "real jobs as Slurm jobs, in real time" in banner(real, "nats://x")
    assert "emulated" not in banner(real, "nats://x")
    assert real.round_wall_s == ROUND_S
    emulated = StackConfig(executor="slurm")
    assert "emulated jobs as Slurm jobs, time x60" in banner(emulated, "nats://x")
    # the bridge runs what the banner says, whatever hops up inherited
    bridge = by_name(emulated)["cluster"]
    assert environment(emulated, bridge, real_env)["HOPS_EXECUTOR_BACKEND"] == "emulated"
    bridge = by_name(real)["cluster"]
    assert environment(real, bridge, {})["HOPS_EXECUTOR_BACKEND"] == "real"


def test_hops_up_help_names_both_kinds_of_slurm_jobs() -> None:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "emulated or, with --slurm-jobs real, its own command" in text, text
    assert "without the flag, $HOPS_EXECUTOR_BACKEND as the bridge reads it" in text, text
