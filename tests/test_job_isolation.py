"""Who a real job runs as and what it inherits (executor.isolation): the
clean environment, the job user and the refusal of root, the run folders
the job owns and the files the executor opens in them, and how the
executor, the per-start check and ``hops up`` use them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import structlog

import executor.__main__ as executor_main
from cli.up.stack import StackConfig, by_name, default_job_user
from executor.isolation import (
    FolderError,
    JobIdentity,
    JobUserError,
    UserEntry,
    base_env,
    open_job_file,
    passes,
    prepare_folders,
    resolve_identity,
    root_refusal,
    traversable,
    unreachable,
)
from executor.launch import LaunchOptions, job_paths, launches
from executor.real import RealBackend
from executor.realjob import RealSettings
from executor.reports import ReportTail, log_tail
from services.runtime.settings import parse_args
from shared import jobenv
from shared.cluster import Server
from shared.ids import GpuType
from shared.wire import FORBIDDEN
from tests.test_executor_launch import A, spec, start
from world.clusters import cluster_arg

EXECUTOR_ENV = {
    "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC",
    "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/cuda/lib", "NCCL_SOCKET_IFNAME": "eth0",
    "HOPS_NATS_URL": "nats://10.0.0.1:4222", "HOPS_NATS_NKEY": "/d/credentials/x.nk",
    "HOPS_NATS_CA": "/d/ca.pem", "HOPS_TOKEN": "secret", "HOPS_TENANTS": "/d/tenants.yaml",
    "HOPS_GATEWAY_KEY": "/d/key.pem", "HOPS_JOB_ID": "inherited", "AWS_SECRET_ACCESS_KEY": "x",
    "HOME": "/root", "USER": "root", "SSH_AUTH_SOCK": "/tmp/agent", "VIRTUAL_ENV": "/v",
}
USERS = {"root": UserEntry("root", 0, 0), "0": UserEntry("root", 0, 0),
         "nobody": UserEntry("nobody", 65534, 65534),
         "65534": UserEntry("nobody", 65534, 65534), "alice": UserEntry("alice", 1000, 1000),
         "1000": UserEntry("alice", 1000, 1000), "toor": UserEntry("toor", 0, 0)}
NOBODY = JobIdentity("nobody", 65534, 65534, switch=True)


# --- the environment ----------------------------------------------------------------


def test_a_job_inherits_only_the_allow_listed_variables_and_no_hops_one() -> None:
    env = base_env(EXECUTOR_ENV, home="/runs/j", user="nobody")
    assert env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC",
                   "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/cuda/lib",
                   "NCCL_SOCKET_IFNAME": "eth0", "HOME": "/runs/j", "USER": "nobody",
                   "LOGNAME": "nobody"}
    assert "USER" not in base_env(EXECUTOR_ENV, home="/h")  # unknown: not the executor's
    assert not any(passes(k) for k in ("HOPS_NATS_URL", "HOPS_TOKEN", "HOPS_PATH", "HOME"))


def test_the_launch_adds_the_jobs_own_env_and_the_executors_variables_last(
        tmp_path: Path) -> None:
    paths = job_paths(tmp_path, "j", A)
    ranks = launches(start(), LaunchOptions(gpu_type="cpu"), paths, EXECUTOR_ENV, NOBODY)
    for rank in ranks:
        env = rank.env
        assert env["HOME"] == str(tmp_path / "j") and env["USER"] == "nobody"
        assert env["DATA"] == "/data" and env["PATH"] == "/usr/bin:/bin"  # the job's, inherited
        assert env[jobenv.JOB_ID] == "j"  # the executor's, not the inherited one
        secrets = {k for k in env if k.startswith("HOPS_") and k not in jobenv.RESERVED}
        assert secrets == set() and "AWS_SECRET_ACCESS_KEY" not in env
        assert (rank.uid, rank.gid) == (65534, 65534)
    own = launches(start(), LaunchOptions(gpu_type="cpu"), paths, EXECUTOR_ENV)[0]
    assert (own.uid, own.gid) == (None, None) and "USER" not in own.env  # the executor's user


# --- the job user -------------------------------------------------------------------


def resolve(wanted: str, allow_root: bool = False, euid: int = 0) -> JobIdentity:
    return resolve_identity(wanted, allow_root, euid, euid, USERS.get)


def test_a_root_executor_switches_to_the_job_user_and_refuses_root() -> None:
    nobody = resolve("nobody")
    assert (nobody.name, nobody.uid, nobody.gid, nobody.switch) == ("nobody", 65534, 65534, True)
    assert nobody.refusal() is None and "jobs run as nobody" in nobody.note
    assert resolve("1000").name == "alice"  # a uid names the user too
    for wanted in ("", "root", "toor", "0"):  # none, or root under any name
        ident = resolve(wanted)
        assert not ident.switch and ident.uid == 0
        why = ident.refusal()
        assert why is not None and "--job-user" in why and "--allow-root-jobs" in why
    allowed = resolve("", allow_root=True)
    assert allowed.refusal() is None and "allowed by --allow-root-jobs" in allowed.note
    with pytest.raises(JobUserError, match="'ghost' does not exist"):
        resolve("ghost")


def test_an_executor_that_is_not_root_runs_jobs_as_itself_and_says_so() -> None:
    ident = resolve("nobody", euid=1000)
    assert (ident.name, ident.uid, ident.switch, ident.refusal()) == ("alice", 1000, False, None)
    assert "not root" in ident.note and "nobody ignored" in ident.note
    assert "ignored" not in resolve("", euid=1000).note


def test_every_start_checks_again_that_no_job_runs_as_root() -> None:
    assert root_refusal(NOBODY, euid=0) is None
    assert root_refusal(resolve("", euid=1000), euid=1000) is None
    # An identity that does not switch, in an executor that is root: root jobs.
    stale = JobIdentity("alice", 1000, 1000)
    assert root_refusal(stale, euid=0) is not None
    assert root_refusal(resolve("", allow_root=True), euid=0) is None


def test_a_start_that_would_run_as_root_is_refused_not_failed(tmp_path: Path) -> None:
    def backend(ident: JobIdentity) -> RealBackend:
        settings = RealSettings(tmp_path, LaunchOptions(gpu_type="cpu"), identity=ident)
        return RealBackend(Server(A, GpuType("cpu"), 2), settings, sink=None,  # type: ignore[arg-type]
                           log=structlog.get_logger(), spawn_task=lambda coro, name: None)

    cmd = start(job=spec(workdir=str(tmp_path)))
    no = backend(JobIdentity("root", 0, 0)).check(cmd)
    assert no is not None and (no.code, no.fail_job) == (FORBIDDEN, False)  # elsewhere, maybe
    assert "refusing to run jobs as root" in no.error
    assert backend(JobIdentity("root", 0, 0, allow_root=True)).check(cmd) is None
    assert backend(NOBODY).check(cmd) is None


def test_a_folder_closed_to_the_job_user_is_named(tmp_path: Path) -> None:
    assert traversable(0o711, 0, 0, 65534, 65534) and not traversable(0o700, 0, 0, 65534, 65534)
    assert traversable(0o710, 0, 7, 65534, 7) and traversable(0o700, 5, 0, 5, 0)
    assert not traversable(0o070, 5, 5, 5, 5)  # the owner's bits decide for the owner
    assert traversable(0o000, 5, 5, 0, 0)  # root passes everywhere
    closed = tmp_path / "closed"
    (closed / "runs").mkdir(parents=True)
    closed.chmod(0o700)
    st = closed.stat()
    other = st.st_uid + 1
    assert unreachable(closed / "runs", other, other + 1) in (closed, *closed.parents)
    assert unreachable(closed / "runs", st.st_uid, st.st_gid) is None


# --- the job's folders and files ----------------------------------------------------


def test_run_folders_are_private_and_links_in_them_are_refused(tmp_path: Path) -> None:
    me = JobIdentity("me", os.geteuid(), os.getegid(), switch=os.geteuid() == 0)
    paths = job_paths(tmp_path / "runs", "j", A)
    folders = (paths.logs, paths.checkpoint, paths.report.parent)
    prepare_folders(paths.root, folders, (paths.report,), me)
    for folder in (paths.root, *folders):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    paths.checkpoint.rmdir()
    target = tmp_path / "target"
    target.mkdir(mode=0o755)
    paths.checkpoint.symlink_to(target)
    with pytest.raises(FolderError, match="link"):
        prepare_folders(paths.root, folders, (paths.report,), me)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # not changed through the link
    paths.checkpoint.unlink()
    paths.checkpoint.write_text("a file")
    with pytest.raises(FolderError, match="not a folder"):
        prepare_folders(paths.root, folders, (paths.report,), me)
    paths.checkpoint.unlink()
    paths.report.symlink_to(tmp_path / "elsewhere")
    if me.switch:  # only then does the executor touch the job's files
        with pytest.raises(FolderError, match="symbolic link"):
            prepare_folders(paths.root, folders, (paths.report,), me)


def test_the_executor_never_follows_a_link_the_job_left_for_its_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("credential\n")
    log = tmp_path / "rank0.log"
    log.symlink_to(secret)
    assert log_tail(log) == ""  # not the credential, published in job_failed
    with pytest.raises(FolderError, match="symbolic link"):
        open_job_file(log, append=True)
    assert secret.read_text() == "credential\n"  # nothing appended to it
    report = tmp_path / "report.jsonl"
    os.mkfifo(report)  # would block a reader for ever
    assert ReportTail(report).read(final=True) == []
    plain = tmp_path / "plain.log"
    with open_job_file(plain, append=True) as f:
        f.write(b"line\n")
    assert log_tail(plain) == "line"


# --- hops up ------------------------------------------------------------------------


def test_hops_up_runs_real_jobs_as_nobody_when_root(tmp_path: Path) -> None:
    assert default_job_user("real", euid=0) == "nobody"
    assert default_job_user("real", euid=1000) == default_job_user("emulated", 0) == ""
    config = StackConfig(executor="real", job_user="nobody", data_dir=tmp_path)
    command = by_name(config)["cluster"].command
    assert command[-2:] == ("--job-user", "nobody") and "--allow-root-jobs" not in command
    root = by_name(StackConfig(executor="real", allow_root_jobs=True))["cluster"].command
    assert root[-1] == "--allow-root-jobs" and "--job-user" not in root
    with pytest.raises(ValueError, match="job user is for real executors"):
        StackConfig(job_user="nobody")


# --- the executor's start -------------------------------------------------------------

CLUSTER = ("gpu_types: [{name: cpu, link_bandwidth: 1.0e9, net_bandwidth: 1.0e9}]\n"
           "servers: [{id: a, gpu_type: cpu, gpus: 1}, {id: b, gpu_type: cpu, gpus: 1}]\n")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root executor switches users")


def executor_exit(tmp_path: Path, *flags: str) -> int:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER)
    return executor_main.main(["--cluster", str(cluster), "--backend", "real",
                               "--run-dir", str(tmp_path / "runs"), *flags])


@root_only
def test_a_root_executor_without_a_job_user_stops_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # exit code 2 before it connects to NATS, one executor or all of them
    for flags in (("--server-id", "a"), ("--all",), ("--all", "--job-user", "root")):
        assert executor_exit(tmp_path, *flags) == 2
        err = capsys.readouterr().err
        assert "hops-executor: refusing to run jobs as root" in err and "--job-user" in err


@root_only
def test_the_job_user_must_reach_the_run_folder(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path.chmod(0o700)  # root's own
    assert executor_exit(tmp_path, "--all", "--job-user", "nobody") == 2
    assert "job user nobody cannot reach the run folder" in capsys.readouterr().err


def test_an_unknown_job_user_stops_the_executor(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert executor_exit(tmp_path, "--server-id", "a", "--job-user", "no-such-user-here") == 2
    assert "job user 'no-such-user-here' does not exist" in capsys.readouterr().err


def test_the_executor_switches_read_their_variables(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    cluster = cluster_arg(str(path))

    def switches(*flags: str) -> tuple[bool, bool]:
        argv = ["--cluster", str(path), "--server-id", "a", *flags]
        _, args = parse_args(argv, service="executor", parser=executor_main._parser())
        s = executor_main.executor_settings(args, cluster)
        return s.allow_root_jobs, s.deterministic_trainers

    assert switches() == (False, False)
    monkeypatch.setenv("HOPS_ALLOW_ROOT_JOBS", "yes")
    monkeypatch.setenv("HOPS_DETERMINISTIC_TRAINERS", " On ")
    assert switches() == (True, True)
    monkeypatch.setenv("HOPS_ALLOW_ROOT_JOBS", "off")
    monkeypatch.setenv("HOPS_DETERMINISTIC_TRAINERS", "0")
    assert switches() == (False, False)
    assert switches("--allow-root-jobs", "--deterministic-trainers") == (True, True)


@pytest.mark.parametrize(("var", "flags"), [
    ("HOPS_ALLOW_ROOT_JOBS", ("--all",)),  # the supervisor, before any child
    ("HOPS_DETERMINISTIC_TRAINERS", ("--server-id", "a")),
])
def test_a_switch_neither_on_nor_off_stops_the_executor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        var: str, flags: tuple[str, ...]) -> None:
    # "maybe" once read as off; now it stops the executor at once, as a bad
    # number does (the unknown job user would stop it later, after the check)
    monkeypatch.setenv(var, "maybe")
    with pytest.raises(SystemExit) as stop:
        executor_exit(tmp_path, *flags, "--job-user", "no-such-user-here")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"hops-executor: error: {var} must be on (1, true, yes, on) or off" in err
    assert "got 'maybe'" in err
