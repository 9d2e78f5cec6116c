"""The real executor's pure parts: how a job's processes are launched (argv,
environment, ranks, paths, CPU pinning), what the machine's devices are
(NVML, or the cluster file's declaration), what the report lines and the
end of a job mean, and how the supervisor and ``hops up`` run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import executor.__main__ as executor_main
from cli.up.stack import StackConfig, by_name
from cli.up.up import banner
from executor.discovery import DiscoveryError, declared_devices, discover
from executor.launch import (
    AffinityError,
    LaunchOptions,
    check_affinity,
    job_paths,
    launches,
    parse_affinity,
    parse_cores,
    rank_offset,
)
from executor.reports import End, JobReports, ReportTail, log_tail, split_lines, verdict
from executor.supervisor import child_argv
from shared import jobenv
from shared.cluster import Server
from shared.configuration import Configuration
from shared.events import JobFailed, JobFinished, ProfileReported, SampleReported, StartJob
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.jobreport import Checkpointed, Finished, Profiled, Progress, Sampled, encode_line
from shared.measurements import TimeModules
from shared.node import Rendezvous, rendezvous_port

A, B = ServerId("a"), ServerId("b")
MEET = Rendezvous("10.0.0.1", 31000)
OPTS = LaunchOptions(gpu_type="cpu", sample_s=2.0, profile_iters=7, threads=1)


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {"command": ("python", "train.py", "--epochs", "3"), "workdir": "/w",
                            "env": {"DATA": "/data"}, "lr": {3: 0.3}}
    base.update(kw)
    return JobSpec(JobId("j"), "m", 32, 1000, 5000, requirements=(1, 3), **base)


def start(server: ServerId = A, config: dict[str, int] | None = None,
          indices: tuple[int, ...] = (2, 3), mode: str = "run",
          rendezvous: Rendezvous | None = MEET,
          job: JobSpec | None = None) -> StartJob:
    return StartJob(key="start:t1.r1.p1:j@a", job_id=JobId("j"), server_id=server,
                    spec=job or spec(), configuration=Configuration.of(config or {A: 2, B: 1}),
                    gpu_indices=indices, samples_done=1500.0, mode=mode,  # type: ignore[arg-type]
                    rendezvous=rendezvous)


# --- launch ------------------------------------------------------------------------------


def test_one_process_per_gpu_with_the_distributed_launch_variables(tmp_path: Path) -> None:
    paths = job_paths(tmp_path, "j", A)
    base = {"PATH": "/bin", "RANK": "9", "CUDA_VISIBLE_DEVICES": "7"}
    ranks = launches(start(), OPTS, paths, base)
    assert [r.local_rank for r in ranks] == [0, 1]
    for k, r in enumerate(ranks):
        assert r.argv == ("python", "train.py", "--epochs", "3") and r.cwd == "/w"
        assert r.log == tmp_path / "j" / "logs" / f"a-rank{k}.log"
        env = r.env
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(k), str(k))  # the executor's, not base's
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "2")
        assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # every GPU of the job here, for each rank
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "31000")
        assert env["PATH"] == "/bin" and env["DATA"] == "/data"
        assert env[jobenv.LR] == "0.3" and env[jobenv.TOTAL_GPUS] == "3"
        assert (env[jobenv.NODES], env[jobenv.NODE_RANK], env[jobenv.LOCAL_GPUS]) == ("2", "0",
                                                                                     "2")
        assert env[jobenv.SAMPLES_DONE] == "1500.0" and env[jobenv.TOTAL_SAMPLES] == "5000"
        assert env[jobenv.BATCH_SIZE] == "32" and env[jobenv.MODE] == "run"
        assert (env[jobenv.SAMPLE_S], env[jobenv.PROFILE_ITERS]) == ("2.0", "7")
        assert env[jobenv.THREADS] == env["OMP_NUM_THREADS"] == "1"
        assert env[jobenv.REPORT_FILE] == str(tmp_path / "j" / "reports" / "a.jsonl")
        assert env[jobenv.CHECKPOINT_DIR] == str(tmp_path / "j" / "checkpoint")
        assert (env[jobenv.JOB_ID], env[jobenv.SERVER_ID], env[jobenv.GPU_TYPE]) == ("j", "a",
                                                                                    "cpu")
        assert set(env) >= jobenv.RESERVED


def test_the_second_server_ranks_after_the_first_ones_gpus(tmp_path: Path) -> None:
    cmd = start(server=B, indices=(0,))
    (only,) = launches(cmd, OPTS, job_paths(tmp_path, "j", B), {})
    assert (only.env["RANK"], only.env["LOCAL_RANK"], only.env["WORLD_SIZE"]) == ("2", "0", "3")
    assert only.env[jobenv.NODE_RANK] == "1" and only.env["CUDA_VISIBLE_DEVICES"] == "0"
    config = Configuration.of({"a": 2, "b": 3, "c": 1})
    assert [rank_offset(config, ServerId(s)) for s in "abc"] == [0, 2, 5]


def test_rendezvous_falls_back_to_this_host_and_a_port_from_the_key(tmp_path: Path) -> None:
    (first, _) = launches(start(rendezvous=None), OPTS, job_paths(tmp_path, "j", A), {})
    assert first.env["MASTER_ADDR"] == "127.0.0.1"
    assert first.env["MASTER_PORT"] == str(rendezvous_port("start:t1.r1.p1:j@a"))


def test_a_profiling_run_is_one_process_on_its_own(tmp_path: Path) -> None:
    cmd = start(config={A: 1}, indices=(1,), mode="profile")
    (only,) = launches(cmd, OPTS, job_paths(tmp_path, "j", A), {})
    assert (only.env["WORLD_SIZE"], only.env["RANK"], only.env["MASTER_ADDR"]) == ("1", "0",
                                                                                  "127.0.0.1")
    assert only.env[jobenv.MODE] == "profile" and only.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert jobenv.LR not in only.env  # the table has no rate for 1 GPU, and no rule


def test_threads_are_left_to_the_job_unless_set_and_its_env_may_choose(tmp_path: Path) -> None:
    paths = job_paths(tmp_path, "j", A)
    free = launches(start(), LaunchOptions(gpu_type="cpu"), paths, {})[0].env
    assert jobenv.THREADS not in free and "OMP_NUM_THREADS" not in free
    own = launches(start(job=spec(env={"OMP_NUM_THREADS": "4"})), OPTS, paths, {})[0].env
    assert own["OMP_NUM_THREADS"] == "4" and own[jobenv.THREADS] == "1"
    with pytest.raises(ValueError, match="set by the executor"):
        spec(env={"RANK": "3"})  # reserved: the spec itself refuses it


def test_cpu_affinity_pins_each_rank_to_its_devices_cores(tmp_path: Path) -> None:
    assert parse_cores("0-2,5, 4") == (0, 1, 2, 4, 5)
    assert parse_affinity("0|1", "a") == ((0,), (1,))
    assert parse_affinity("a=0-1|2;b=3", "b") == ((3,),)
    assert parse_affinity("a=0|1", "c") == () and parse_affinity(" ", "a") == ()
    for bad in ("x", "2-1", "-1"):
        with pytest.raises(AffinityError):
            parse_affinity(bad, "a")
    opts = LaunchOptions(gpu_type="cpu", affinity=((0,), (1,), (2, 3), (4,)))
    ranks = launches(start(), opts, job_paths(tmp_path, "j", A), {})
    assert [r.cpus for r in ranks] == [(2, 3), (4,)]  # GPUs 2 and 3
    check_affinity(((0,), (1,)), 2, {0, 1})
    with pytest.raises(AffinityError, match="2 devices"):
        check_affinity(((0,), (1,)), 3, {0, 1})
    with pytest.raises(AffinityError, match=r"\[5\]"):
        check_affinity(((0,), (5,)), 2, {0, 1})


# --- discovery --------------------------------------------------------------------------


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    """Stands in for NVML and a GPU that this machine cannot have: four
    GPUs, 0-1 and 2-3 joined by NvLink, pairs across them under one host
    bridge (0-2) or on other CPU sockets."""

    NVMLError = FakeNvmlError
    NVML_NVLINK_MAX_LINKS = 4

    def __init__(self, count: int = 4) -> None:
        self.count = count
        self.calls: list[str] = []

    # NVML's own method names, as pynvml spells them
    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA A100-SXM4-40GB"  # bytes, as older bindings return

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:04d}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return type("Memory", (), {"total": 40 * 1024**3})()

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return type("Pci", (), {"busId": f"0000:0{h}:00.0"})()

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 2:
            raise FakeNvmlError("no such link")
        return 1 if link == 0 else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return self.nvmlDeviceGetPciInfo(h ^ 1)  # 0 <-> 1, 2 <-> 3

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 30 if {a, b} == {0, 2} else 50


class NoNvml:
    """Stands in for a machine without the NVML library."""

    NVMLError = FakeNvmlError

    def nvmlInit(self) -> None:
        raise FakeNvmlError("NVML Shared Library Not Found")


def test_discovery_lists_gpus_and_their_links_through_nvml() -> None:
    nvml = FakeNvml()
    found = discover(Server(A, GpuType("A100"), 4), nvml)
    assert found.source == "nvml" and nvml.calls == ["init", "shutdown"]
    first = found.devices[0]
    assert (first.name, first.memory_mb, first.uuid, first.source) == (
        "NVIDIA A100-SXM4-40GB", 40 * 1024, "GPU-0000", "nvml")
    assert first.links == {1: "nvlink", 2: "pcie-host-bridge", 3: "system"}
    assert found.devices[3].links == {0: "system", 1: "system", 2: "nvlink"}


def test_without_nvml_the_declared_gpus_are_used_and_said_so() -> None:
    found = discover(Server(A, GpuType("cpu"), 2), NoNvml())
    assert found.source == "declared" and found.devices == declared_devices(
        Server(A, GpuType("cpu"), 2))
    assert [(d.index, d.name, d.source) for d in found.devices] == [(0, "cpu", "declared"),
                                                                   (1, "cpu", "declared")]
    assert "NVML unavailable" in found.message
    assert "running with 2 declared GPUs of type cpu" in found.message


def test_nvml_must_find_the_declared_number_of_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(DiscoveryError, match=r"finds 4 GPUs.*declares 8 for a"):
        discover(Server(A, GpuType("A100"), 8), FakeNvml())
    # the executor says so and exits 2 before it even connects to NATS
    cluster = tmp_path / "c.yaml"
    cluster.write_text("gpu_types: [{name: A100, link_bandwidth: 1.0e9, net_bandwidth: 1.0e9}]\n"
                       "servers: [{id: a, gpu_type: A100, gpus: 8}]\n")
    monkeypatch.setattr(executor_main, "discover", lambda server: discover(server, FakeNvml()))
    code = executor_main.main(["--cluster", str(cluster), "--server-id", "a", "--backend", "real",
                               "--run-dir", str(tmp_path / "runs"), "--allow-root-jobs"])
    assert code == 2
    assert "NVML finds 4 GPUs on this machine, but the cluster file declares 8" in (
        capsys.readouterr().err)


# --- reports ------------------------------------------------------------------------------


def test_whole_lines_only_and_unreadable_ones_skipped() -> None:
    good = encode_line(Progress(samples_done=5.0))
    data = good + b"not json\n" + b'{"kind": "newer-kind"}\n' + good[:10]
    reports, used, bad = split_lines(data)
    assert reports == [Progress(samples_done=5.0)] and bad == 2
    assert used == len(data) - 10  # the torn last line waits for its end
    assert split_lines(good[:-1], final=True)[0] == [Progress(samples_done=5.0)]


def test_the_tail_keeps_its_offset_and_reads_a_line_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    tail = ReportTail(path)
    assert tail.read() == []  # no file yet
    line = encode_line(Progress(samples_done=1.0))
    path.write_bytes(line + line[:7])
    assert tail.read() == [Progress(samples_done=1.0)] and tail.offset == len(line)
    with path.open("ab") as f:
        f.write(line[7:])
    assert tail.read() == [Progress(samples_done=1.0)] and tail.offset == 2 * len(line)
    again = ReportTail(path, offset=len(line))  # a restarted executor, from its saved offset
    assert len(again.read()) == 1
    path.write_bytes(line)  # replaced by a shorter file: read anew
    assert tail.read() == [Progress(samples_done=1.0)]


def test_log_tail_is_the_last_lines_within_a_size(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, lines=3) == "line 97\nline 98\nline 99"
    assert len(log_tail(log, lines=100, max_bytes=50)) <= 50
    assert log_tail(log, lines=100, max_bytes=50).startswith("line 9")  # no partial line
    assert log_tail(tmp_path / "missing.log") == ""


def reports_for(mode: str = "run") -> JobReports:
    cmd = start(config={A: 2} if mode == "run" else {A: 1},
                indices=(0, 1) if mode == "run" else (0,), mode=mode)
    return JobReports(cmd, GpuType("cpu"), samples_done=cmd.samples_done)


def test_report_lines_become_progress_samples_and_profiles() -> None:
    job = reports_for()
    sampled = job.apply(Sampled(samples_done=2000.0, per_gpu_throughput=50.0,
                                data_times=(0.1, 0.2), wait_times=(0.0, 0.1),
                                comm_times=(0.004, 0.005)), now=5.0)
    assert isinstance(sampled, SampleReported) and sampled.at == 5.0
    s = sampled.sample
    assert (s.job_id, s.server_id, s.gpu_type, s.local_gpus, s.nodes, s.total_gpus) == (
        "j", "a", "cpu", 2, 1, 2)
    assert (s.data_times, s.wait_times, s.comm_times) == ((0.1, 0.2), (0.0, 0.1), (0.004, 0.005))
    assert job.samples_done == 2000.0 and not job.done
    with pytest.raises(ValueError):
        job.apply(Sampled(samples_done=1.0, per_gpu_throughput=float("inf")))
    with pytest.raises(ValueError, match="comm times"):
        job.apply(Sampled(samples_done=1.0, per_gpu_throughput=1.0, comm_times=(-1.0,)))
    assert job.apply(Finished(samples_done=5000.0)) is None and job.finished and job.done
    prof = reports_for("profile")
    modules = TimeModules(t_f=0.1, t_d=(0.01,))
    msg = prof.apply(Profiled(modules=modules, batch_size=16, iterations=5))
    assert isinstance(msg, ProfileReported) and prof.done
    assert (msg.report.server_id, msg.report.gpu_type, msg.report.batch_size) == ("a", "cpu", 16)


def test_the_verdict_of_a_jobs_end() -> None:
    job = reports_for()
    job.apply(Finished(samples_done=5000.0))
    ok = verdict(job, End({0: 0, 1: 0}, log_tail="bye"), node_rank=0, now=1.0)
    assert ok == JobFinished(job_id=JobId("j"), at=1.0, exit_code=0, log_tail="bye")
    assert verdict(job, End({0: 0, 1: 0}), node_rank=1, now=1.0) is None  # rank 0 speaks
    failed = verdict(job, End({1: -9, 0: 0}), node_rank=1, now=1.0)
    assert isinstance(failed, JobFailed) and failed.exit_code == -9
    assert failed.reason == "job process exited with code -9 on a"
    stopped = reports_for()
    stopped.apply(Checkpointed(samples_done=2500.0))
    assert verdict(stopped, End({0: 0, 1: 0}), node_rank=0, now=1.0) is None
    lost = verdict(reports_for(), End({0: None, 1: None}, adopted=True), node_rank=0, now=1.0)
    assert isinstance(lost, JobFailed) and lost.exit_code is None and "unknown" in lost.reason
    adopted = verdict(job, End({0: None, 1: None}, adopted=True), node_rank=0, now=1.0)
    assert isinstance(adopted, JobFinished) and adopted.exit_code is None
    assert verdict(reports_for("profile"), End({0: 0}), node_rank=0, now=1.0) is None


# --- running it: the supervisor and hops up -------------------------------------------


def test_the_supervisor_passes_the_backend_flags_to_each_executor() -> None:
    argv = ["--cluster", "c.yaml", "--all", "--backend", "real", "--run-dir", "/r",
            "--cpu-affinity", "local-a=0|1;local-b=1", "--health-port", "9000"]
    assert child_argv(argv, "local-b", 1) == [
        "--cluster", "c.yaml", "--backend", "real", "--run-dir", "/r",
        "--cpu-affinity", "local-a=0|1;local-b=1", "--server-id", "local-b", "--order", "1"]


def test_hops_up_runs_real_executors_on_request(tmp_path: Path) -> None:
    config = StackConfig(cluster="examples/cluster-local-cpu.yaml", executor="real",
                         cpu_affinity="local-a=0|1;local-b=1", data_dir=tmp_path)
    cluster = by_name(config)["cluster"]
    assert cluster.command == ("python", "-m", "executor", "--cluster",
                               "examples/cluster-local-cpu.yaml", "--all", "--backend", "real",
                               "--cpu-affinity", "local-a=0|1;local-b=1")
    assert cluster.env == {"HOPS_RUN_DIR": str(tmp_path / "runs"),
                           "HOPS_NATS_CREDENTIALS_DIR": str(tmp_path / "credentials")}
    # Emulated by default, and said so: a HOPS_EXECUTOR_BACKEND=real in the
    # shell hops up runs in does not reach the executors it starts.
    emulated = by_name(StackConfig())["cluster"].command
    assert emulated[emulated.index("--backend") + 1] == "emulated"
    with pytest.raises(ValueError, match="executor must be"):
        StackConfig(executor="gpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="real executors"):
        StackConfig(cpu_affinity="0|1")
    assert "real executors" in banner(config, "nats://x")
