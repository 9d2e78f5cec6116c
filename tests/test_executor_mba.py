"""Memory bandwidth caps through resctrl (CODA §V-D: the contention
eliminator throttles CPU jobs with Intel MBA), on a FAKE resctrl tree: the
kernel's resctrl cannot exist on this machine, so each test makes the
directories and files the kernel would show (``schemata``, ``tasks``,
``info/MB/*``) under ``tmp_path``. A plain directory does not act as the
kernel's: ``mkdir`` makes no files in a group, and a thread id written to
a ``tasks`` file is only appended there (the kernel moves the thread, and
lists it in one group only). The tests check what the executor writes.

The thread ids of the last tests are real: processes started in their own
process group, read from ``/proc`` as the executor reads them.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from executor.emulated import JobProcess
from executor.isolation import JobIdentity
from executor.launch import LaunchOptions
from executor.ledger import NodeLedger
from executor.mba import JobCap, MbaControl, MbaError, cap_level, mb_line
from executor.membw import detect
from executor.pinning import group_threads
from executor.real import RealBackend
from executor.realjob import RealSettings
from executor.service import NodeExecutor
from executor.settings import ExecutorSettings
from shared import events as ev
from shared.cluster import Server
from shared.configuration import Configuration
from shared.events import INTERNAL, INVALID
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec

S = ServerId("s")
SCHEMATA = "    L3:0=fff;1=fff\n    MB:0=100;1=100\n"


def fake_resctrl(root: Path, gran: int | None = 10, low: int | None = 10,
                 schemata: str = SCHEMATA) -> Path:
    """A fake resctrl tree at ``root`` (see the module docstring)."""
    root.mkdir(parents=True)
    (root / "schemata").write_text(schemata)
    (root / "tasks").write_text("")
    info = root / "info" / "MB"
    info.mkdir(parents=True)
    for name, value in (("bandwidth_gran", gran), ("min_bandwidth", low), ("num_closids", 8)):
        if value is not None:
            (info / name).write_text(f"{value}\n")
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return fake_resctrl(tmp_path / "resctrl")


def tasks(path: Path) -> list[int]:
    return [int(t) for t in path.read_text().split()]


def groups(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("hops-mba-"))


# --- the groups ------------------------------------------------------------------------------


def test_a_cap_makes_its_group_and_moves_every_thread_into_it(root: Path) -> None:
    assert MbaControl(root).apply(7, 50, [11, 12, 13]) == 3
    assert groups(root) == ["hops-mba-50"]
    assert (root / "hops-mba-50" / "schemata").read_text() == "MB:0=50;1=50\n"
    assert tasks(root / "hops-mba-50" / "tasks") == [11, 12, 13]
    assert tasks(root / "tasks") == []


@pytest.mark.parametrize(("percent", "group"), [(45, "hops-mba-50"), (5, "hops-mba-10"),
                                                 (1, "hops-mba-10"), (90, "hops-mba-90")])
def test_a_cap_is_rounded_up_to_the_granularity_and_raised_to_the_minimum(
        root: Path, percent: int, group: str) -> None:
    MbaControl(root).apply(7, percent, [11])
    assert groups(root) == [group]
    level = group.removeprefix("hops-mba-")
    assert (root / group / "schemata").read_text() == f"MB:0={level};1={level}\n"


def test_the_kernels_granularity_and_minimum_are_read_and_defaulted(tmp_path: Path) -> None:
    coarse = MbaControl(fake_resctrl(tmp_path / "coarse", gran=20, low=30))
    assert [coarse.level(p) for p in (1, 30, 31, 41, 81, 100)] == [30, 40, 40, 60, 100, 100]
    bare = MbaControl(fake_resctrl(tmp_path / "bare", gran=None, low=None))
    assert [bare.level(p) for p in (5, 45, 50, 91)] == [10, 50, 50, 100]


@given(st.integers(1, 100), st.sampled_from([1, 5, 10, 20, 25]), st.integers(0, 40))
def test_a_level_never_caps_harder_than_asked_and_is_one_the_kernel_takes(
        percent: int, gran: int, low: int) -> None:
    level = cap_level(percent, gran, low)
    assert max(percent, low) <= level <= 100  # never harder than asked, never below the minimum
    assert level == 100 or level == low or level % gran == 0
    assert level == 100 or level == low or level - percent < gran  # the least such level


def test_jobs_at_one_level_share_one_group(root: Path) -> None:
    control = MbaControl(root)
    control.apply(7, 50, [11, 12])
    control.apply(8, 45, [21])  # rounds to the same level
    control.apply(9, 30, [31])
    assert groups(root) == ["hops-mba-30", "hops-mba-50"]
    assert tasks(root / "hops-mba-50" / "tasks") == [11, 12, 21]


def test_no_cap_moves_the_threads_back_to_the_root(root: Path) -> None:
    assert MbaControl(root).apply(7, 100, [11, 12]) == 2
    assert tasks(root / "tasks") == [11, 12]
    assert groups(root) == []


def test_each_thread_id_is_one_write_and_an_ended_thread_is_skipped(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        writes.append(data)
        if data == b"12\n":  # as the kernel answers a thread that ended
            raise ProcessLookupError(errno.ESRCH, "No such process")
        if data == b"13\n":
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)  # as executor.mba calls it
    assert MbaControl(root).apply(7, 50, [11, 12, 14]) == 2
    assert writes == [b"11\n", b"12\n", b"14\n"]
    assert tasks(root / "hops-mba-50" / "tasks") == [11, 14]
    with pytest.raises(MbaError, match=r"cannot move thread 13 .*not permitted"):
        MbaControl(root).apply(7, 50, [13])


def test_prune_removes_only_the_empty_hops_groups(root: Path) -> None:
    control = MbaControl(root)
    control.apply(7, 50, [11])
    control.apply(8, 30, [21])
    (root / "hops-mba-30" / "tasks").write_text("")  # its threads ended
    (root / "hops-mba-70").mkdir()  # made, never written to
    (root / "other").mkdir()  # someone else's group, empty
    (root / "other" / "tasks").write_text("")
    assert control.prune() == ["hops-mba-30", "hops-mba-70"]
    assert groups(root) == ["hops-mba-50"]
    assert (root / "other").is_dir()
    assert MbaControl(root / "missing").prune() == []


def test_what_cannot_be_capped_raises_one_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MbaError, match=r"resctrl is not available at .*missing"):
        MbaControl(tmp_path / "missing").apply(7, 50, [11])
    with pytest.raises(MbaError, match="cannot open"):
        MbaControl(tmp_path / "missing").apply(7, 100, [11])
    no_mb = fake_resctrl(tmp_path / "l3-only", schemata="L3:0=fff;1=fff\n")
    with pytest.raises(MbaError, match=r"no memory bandwidth allocation \(MBA\)"):
        MbaControl(no_mb).apply(7, 50, [11])
    amd = fake_resctrl(tmp_path / "amd", schemata="MB:0=2048;1=2048\n")
    with pytest.raises(MbaError, match=r"does not take MB caps in percent \(root MB line"):
        MbaControl(amd).apply(7, 50, [11])
    full = fake_resctrl(tmp_path / "full")

    def no_closid(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "mkdir", no_closid)
    with pytest.raises(MbaError, match=r"no resctrl group \(CLOSID\) is left; the CPU has 8"):
        MbaControl(full).apply(7, 50, [11])
    assert groups(full) == [] and groups(no_mb) == [] and groups(amd) == []


def test_the_schemata_mb_line_is_read_with_its_domains() -> None:
    assert mb_line(SCHEMATA) == {"0": "100", "1": "100"}
    assert mb_line("L3:0=fff\n") == {}
    assert detect(Path("/nonexistent")).mba is False


# --- the job's cap ---------------------------------------------------------------------------


def test_a_job_cap_moves_its_threads_once_capped_and_never_touches_resctrl_uncapped(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads = {7: [11, 12]}
    cap = JobCap(MbaControl(root / "absent"), 7, threads=threads.__getitem__)
    assert cap.set(100) == 0 and not cap.due() and cap.end() == []  # no resctrl: no error
    cap = JobCap(MbaControl(root), 7, threads=threads.__getitem__, every_s=0.0)
    assert cap.set(50) == 2 and cap.due()
    threads[7].append(13)  # a thread made meanwhile is caught on the next pass
    assert cap.keep() is None
    assert tasks(root / "hops-mba-50" / "tasks") == [11, 12, 11, 12, 13]
    (root / "hops-mba-50" / "tasks").write_text("")  # the kernel moves them: the group empties
    assert cap.set(30) == 3 and groups(root) == ["hops-mba-30"]  # the old level pruned
    (root / "schemata").write_text("L3:0=fff\n")  # MBA gone: nothing changes
    with pytest.raises(MbaError, match="no memory bandwidth allocation"):
        cap.set(20)
    assert cap.percent == 30 and tasks(root / "hops-mba-30" / "tasks") == [11, 12, 13]
    assert cap.keep() is not None and cap.keep() is None  # said once a minute at most
    (root / "schemata").write_text(SCHEMATA)
    real_write, refused = os.write, list[bytes]()

    def write(fd: int, data: bytes) -> int:  # thread 12 cannot move, once
        if data == b"12\n" and not refused:
            refused.append(data)
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(MbaError, match="cannot move thread 12"):
        cap.set(20)
    assert cap.percent == 30 and tasks(root / "hops-mba-20" / "tasks") == [11]
    assert tasks(root / "hops-mba-30" / "tasks") == [11, 12, 13, 11, 12, 13]  # 11 moved back


def test_the_emulated_backend_only_notes_a_cap(tmp_path: Path) -> None:
    cmd = start_cmd("e", Configuration.cpu(S, 2), ("true",))
    job = JobProcess(cmd, "lead", cast(Any, None), structlog.get_logger(), lambda: None)
    job.cores_file = tmp_path / "cores"
    job.retune(1, (), mba_percent=40)
    assert job.cmd.configuration.mba_percent == 40 and job.cmd.configuration.cores_on(S) == 1
    assert job.cores_file.read_text() == "1\n"


# --- the ledger ------------------------------------------------------------------------------


def start_cmd(job: str, config: Configuration, command: tuple[str, ...]) -> ev.StartJob:
    spec = JobSpec(JobId(job), "script", 1, 1000, 10**9, kind="cpu",
                   cores=config.cores_on(S), command=command)
    return ev.StartJob(key=f"start-{job}", job_id=JobId(job), server_id=S, spec=spec,
                       configuration=config, gpu_indices=())


def set_cores(job: str, cores: int, percent: int, key: str = "") -> ev.SetCores:
    return ev.SetCores(key=key or f"cores-{job}-{cores}-{percent}", job_id=JobId(job),
                       server_id=S, cores=cores, mba_percent=percent)


@pytest.mark.parametrize("mba_on", [False, True])
def test_the_ledger_refuses_a_cap_only_where_the_server_has_no_mba(mba_on: bool) -> None:
    ledger = NodeLedger(Server(S, GpuType("cpu"), 1, cores=4, mba=mba_on))
    capped = start_cmd("c", Configuration.cpu(S, 2, mba_percent=50), ("true",))
    refusal = ledger.refuse_start(capped)
    if mba_on:
        assert refusal is None
    else:
        assert refusal is not None and refusal.code == INVALID
        assert refusal.error == ("s has no memory bandwidth allocation (MBA); job c cannot "
                                 "be capped at 50%")
    plain = start_cmd("c", Configuration.cpu(S, 2), ("true",))
    assert ledger.refuse_start(plain) is None
    ledger.book(plain)
    retune = ledger.refuse_retune(set_cores("c", 1, 50))
    assert (retune is None) if mba_on else (retune is not None and retune.code == INVALID
                                            and "cannot be capped at 50%" in retune.error)
    assert ledger.refuse_retune(set_cores("c", 1, 100)) is None
    assert ledger.allocated().cores == 2  # a refusal changes nothing


def test_a_retune_the_job_does_not_take_is_not_booked() -> None:
    ledger = NodeLedger(Server(S, GpuType("cpu"), 1, cores=4, mba=True), pool=range(4))
    before = ledger.book(start_cmd("c", Configuration.cpu(S, 2), ("true",)))
    taken: list[tuple[int, tuple[int, ...], int]] = []

    def refuse(count: int, cores: tuple[int, ...], percent: int) -> None:
        taken.append((count, cores, percent))
        raise MbaError("no group left")

    with pytest.raises(MbaError):
        ledger.retune(set_cores("c", 3, 50), refuse)
    assert taken == [(3, (0, 1, 2), 50)]
    assert ledger.booking(JobId("c")) == before and ledger.allocated().cores == 2
    after = ledger.retune(set_cores("c", 1, 50), lambda *a: taken.append(a))
    assert after.cores == (0,) and ledger.allocated().cores == 1 and taken[-1] == (1, (0,), 50)


# --- real processes --------------------------------------------------------------------------

THREADS = r'''
import pathlib, signal, sys, threading, time
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
for _ in range(3):
    threading.Thread(target=stop.wait, daemon=True).start()
pathlib.Path(sys.argv[1]).write_text("up")
while not stop.is_set():
    time.sleep(0.02)
'''


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def threaded(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    up = tmp_path / "up"
    proc = subprocess.Popen([sys.executable, "-c", THREADS, str(up)], start_new_session=True)
    try:
        wait_for(up.exists, "the process's threads")
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_real_process_groups_threads_are_moved_into_the_group(
        root: Path, threaded: subprocess.Popen[bytes]) -> None:
    pgid = os.getpgid(threaded.pid)
    assert pgid == threaded.pid != os.getpgid(0)
    tids = group_threads(pgid)
    assert len(tids) >= 4 and threaded.pid in tids
    assert MbaControl(root).apply(pgid, 50, group_threads(pgid)) == len(tids)
    assert sorted(tasks(root / "hops-mba-50" / "tasks")) == sorted(tids)


class NoSink:
    async def sample(self, msg: ev.SampleReported) -> None:
        pass

    def event(self, job_id: str, msg: ev.Report, msg_id: str) -> None:
        pass


async def executor_on(tmp_path: Path, resctrl: Path,
                      spawn: Callable[..., object]) -> tuple[NodeExecutor, RealBackend]:
    server = Server(S, GpuType("cpu"), 1, cores=1)
    log = structlog.get_logger()
    ctx = SimpleNamespace(log=log, spawn=spawn, js=None)  # no bus: the log shipper never runs
    settings = ExecutorSettings(cluster="none", server_id=S, backend="real",
                                run_dir=tmp_path / "runs", server=server, stop_grace_s=5.0,
                                resctrl=resctrl)
    real = RealSettings(run_dir=settings.run_dir, options=LaunchOptions(gpu_type="cpu"),
                        identity=JobIdentity("me", os.geteuid(), os.getegid(), allow_root=True),
                        poll_s=0.05, resctrl=resctrl)
    backend = RealBackend(server, real, NoSink(), log, spawn)
    return NodeExecutor(cast(Any, ctx), settings, cast(Any, None), backend), backend


@pytest.fixture
async def spawner() -> AsyncIterator[Callable[..., object]]:
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Coroutine[Any, Any, None], name: str = "") -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name or None)
        tasks.add(task)
        return task

    yield spawn
    for task in tasks:
        task.cancel()


async def test_the_executor_caps_a_job_at_its_start_and_on_set_cores(
        tmp_path: Path, root: Path, spawner: Callable[..., object]) -> None:
    node, backend = await executor_on(tmp_path, root, spawner)
    assert node.server.mba and node.ledger.server.mba  # detected in the fake tree
    up = tmp_path / "up"
    cmd = start_cmd("crunch", Configuration.cpu(S, 1, mba_percent=45),
                    (sys.executable, "-c", THREADS, str(up)))
    try:
        ack = await node.handle(cmd)
        assert ack.ok, ack.error
        await until(up.exists, "the job's threads")
        job = backend.jobs[JobId("crunch")]
        await until(lambda: set(group_threads(job.pgid)) <= set(tasks(root / "hops-mba-50" /
                                                                        "tasks")), "the cap kept")
        assert len(set(tasks(root / "hops-mba-50" / "tasks"))) >= 4

        ack = await node.handle(set_cores("crunch", 1, 30))
        assert ack.ok and job.cap.percent == 30 and job.cmd.configuration.mba_percent == 30
        assert set(tasks(root / "hops-mba-30" / "tasks")) == set(group_threads(job.pgid))

        (root / "schemata").write_text("L3:0=fff;1=fff\n")  # MBA gone
        failed = await node.handle(set_cores("crunch", 1, 20))
        assert not failed.ok and failed.code == INTERNAL
        assert failed.error.startswith("s: resctrl at ") and "no memory bandwidth" in failed.error
        assert job.cap.percent == 30 and node.ledger.allocated().cores == 1
        assert not (root / "hops-mba-20").exists()

        (root / "schemata").write_text(SCHEMATA)
        ack = await node.handle(set_cores("crunch", 1, 100))
        assert ack.ok and set(tasks(root / "tasks")) == set(group_threads(job.pgid))
    finally:
        stop = await node.handle(ev.StopJob(key="stop", job_id=JobId("crunch")))
        await node.shutdown()
    assert stop.ok


async def test_an_executor_without_mba_refuses_a_capped_start(
        tmp_path: Path, spawner: Callable[..., object]) -> None:
    no_mb = fake_resctrl(tmp_path / "resctrl", schemata="L3:0=fff\n")
    node, backend = await executor_on(tmp_path, no_mb, spawner)
    cmd = start_cmd("crunch", Configuration.cpu(S, 1, mba_percent=50), ("sleep", "30"))
    ack = await node.handle(cmd)
    assert not ack.ok and ack.code == INVALID and "cannot be capped at 50%" in ack.error
    assert backend.jobs == {} and groups(no_mb) == []
    await node.shutdown()
