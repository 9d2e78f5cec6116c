"""The Slurm backend's refusals before any sbatch (:meth:`SlurmBackend.check`):
a node Slurm does not list, reads dead or has drained; an emulated job whose
model the emulator cannot run there; a real job with no command or more GPUs
than its sync scale. No Slurm needed: the watch's reading is set by hand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from executor.launch import LaunchOptions
from executor.slurm.backend import JobEnv, SlurmBackend
from executor.slurm.client import SlurmClient, SlurmClusterSettings
from executor.slurm.nodes import slurm_cluster
from executor.slurm.realjobs import RealJobs
from executor.slurm.records import SlurmNode
from executor.slurm.settings import bridge_settings
from executor.slurm.watch import SlurmWatch
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.events import INVALID, StartJob
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from tests.test_slurm_bridge import NoSink
from world.catalog import builtin_catalog
from world.truth import GroundTruth


def node(name: str, state: str = "idle", flags: tuple[str, ...] = (),
         reason: str = "") -> SlurmNode:
    return SlurmNode(name=name, state=state, state_flags=list(flags), reason=reason,
                     gres="gpu:fake:8", cpus=16, partitions=["hops"])


@pytest.fixture
def watch() -> Iterator[SlurmWatch]:
    """A watch whose latest reading lists n1 and n2 idle (set by hand)."""
    client = SlurmClient(SlurmClusterSettings(slurm_conf="/nowhere"))
    w = SlurmWatch(client, 1.0, 3.0, structlog.get_logger())
    w.nodes = {n.name: n for n in (node("n1"), node("n2"))}
    w.read_at = time.time()
    yield w


def backend(watch: SlurmWatch, server: str = "n1", gpu_type: str = "TitanXP",
            real: bool = False) -> SlurmBackend:
    cluster: Cluster = slurm_cluster([node("n1"), node("n2"), node("n7")], gpu_type)
    jobs = RealJobs(sink=NoSink(), options=LaunchOptions(gpu_type="cpu"), base_env={},
                    stop_grace_s=1.0) if real else None
    return SlurmBackend(cluster.by_id[ServerId(server)], bridge_settings({}, Path("/runs")),
                        watch.client, watch, JobEnv(nats_url="", job_args=[], cluster=""),
                        GroundTruth(cluster, builtin_catalog()), structlog.get_logger(), jobs)


def start(server: str = "n1", gpus: int = 1, **spec: object) -> StartJob:
    fields: dict[str, object] = {"model": "resnet18-cifar10", "batch_size": 256, "params": 1,
                                 "total_samples": 100, "requirements": (1,), **spec}
    job = JobSpec(id=JobId("j"), **fields)  # type: ignore[arg-type]  # the fields vary
    sid = ServerId(server)
    if job.kind == "cpu":
        return StartJob(key="k", job_id=JobId("j"), server_id=sid, spec=job,
                        configuration=Configuration.cpu(sid, job.cores), gpu_indices=())
    return StartJob(key="k", job_id=JobId("j"), server_id=sid, spec=job,
                    configuration=Configuration.of({sid: gpus}),
                    gpu_indices=tuple(range(gpus)))


def test_a_start_on_a_node_slurm_does_not_list_is_refused_up_front(watch: SlurmWatch) -> None:
    refusal = backend(watch, "n7").check(start("n7"))
    assert refusal is not None and (refusal.code, refusal.error) == (
        "slurm_no_node", "n7 is not a node of partition hops")
    assert not refusal.fail_job  # the job waits for a plan on a node Slurm has
    watch.read_at = 0.0  # nothing read yet: nothing known against it
    assert backend(watch, "n7").check(start("n7")) is None


def test_a_start_on_a_node_slurm_reads_dead_is_refused_at_once(watch: SlurmWatch) -> None:
    watch.nodes["n1"] = node("n1", "down", reason="cable")
    refusal = backend(watch).check(start())
    assert refusal is not None and (refusal.code, refusal.error) == (
        "slurm_node_down", "Slurm reads node n1 as down: cable")
    assert backend(watch).alive  # the node itself is called dead only after the debounce


def test_a_start_on_a_drained_node_is_refused(watch: SlurmWatch) -> None:
    watch.nodes["n1"] = node("n1", "idle", ("DRAIN",))
    refusal = backend(watch).check(start())
    assert refusal is not None and (refusal.code, refusal.error) == (
        "slurm_node_drained", "Slurm has drained node n1: no reason given")


def test_an_emulated_job_the_emulator_cannot_run_is_refused(watch: SlurmWatch) -> None:
    assert backend(watch).check(start()) is None
    unknown = backend(watch).check(start(model="no-such-model"))
    assert unknown is not None and unknown.code == INVALID and unknown.fail_job
    assert "unknown model 'no-such-model'" in unknown.error
    # a model the catalog knows, not on this GPU type: another server may run it
    elsewhere = backend(watch, gpu_type="fake").check(start())
    assert elsewhere is not None and elsewhere.code == INVALID and not elsewhere.fail_job
    assert elsewhere.error == "model 'resnet18-cifar10' does not run on fake"
    assert backend(watch).check(start(kind="cpu", cores=2, requirements=())) is None


def test_a_real_job_without_a_command_or_over_its_sync_scale_is_refused(
        watch: SlurmWatch) -> None:
    no_command = backend(watch, real=True).check(start())
    assert no_command is not None and no_command.code == INVALID and no_command.fail_job
    assert no_command.error == "job j has no command; the Slurm bridge runs real jobs"
    relaxed = backend(watch, real=True).check(
        start(gpus=4, command=("python", "t.py"), sync_scale=2, requirements=(1, 2)))
    assert relaxed is not None and relaxed.code == INVALID and not relaxed.fail_job
    assert relaxed.error == ("job j has sync scale 2: it cannot run on 4 GPUs (each needs "
                             "one of its micro-batches)")
    assert backend(watch, real=True).check(start(command=("python", "t.py"))) is None
    # Slurm's own refusals come first, whatever the job
    watch.nodes["n1"] = node("n1", "idle", ("DRAIN",))
    drained = backend(watch, real=True).check(start())
    assert drained is not None and drained.code == "slurm_node_drained"
