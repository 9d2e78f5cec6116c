"""What a real executor keeps across its restart: the state file (atomic,
checked), telling a live process from a dead one or one whose pid was
reused (``/proc/<pid>/stat``), and which jobs to adopt; and the process
group a job's ranks share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from executor.adopt import (
    ExecutorState,
    LaunchRecord,
    RankRecord,
    StateError,
    group_members,
    load_state,
    parse_stat,
    running,
    save_state,
    start_time,
    state_path,
    triage,
)
from executor.launch import RankLaunch
from executor.ranks import LaunchError, signal_group, start_ranks
from shared.configuration import Configuration
from shared.events import StartJob
from shared.ids import JobId, ServerId
from shared.job import JobSpec

A = ServerId("a")


def record(job: str, *pids: int) -> LaunchRecord:
    spec = JobSpec(JobId(job), "m", 8, 100, 1000, requirements=(1,), command=("train",))
    cmd = StartJob(key=f"k-{job}", job_id=JobId(job), server_id=A, spec=spec,
                   configuration=Configuration.of({A: len(pids)}),
                   gpu_indices=tuple(range(len(pids))))
    ranks = tuple(RankRecord(k, pid, 1000 + pid) for k, pid in enumerate(pids))
    return LaunchRecord(cmd=cmd, pgid=pids[0], ranks=ranks, report_file=f"/r/{job}.jsonl",
                        logs=tuple(f"/l/{job}-{k}.log" for k in range(len(pids))),
                        offset=42, samples_done=12.5, finished=False)


def fake_stat(root: Path, pid: int, comm: str, state: str, pgrp: int, started: int) -> None:
    fields = [state, "1", str(pgrp)] + ["0"] * 16 + [str(started)] + ["0"] * 10
    (root / str(pid)).mkdir()
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")


def test_the_state_file_round_trips_atomically(tmp_path: Path) -> None:
    path = state_path(tmp_path / "runs", "a")
    assert path == tmp_path / "runs" / "executor-a.json"
    assert load_state(path, A) == ExecutorState(server_id=A)  # none yet
    state = ExecutorState(server_id=A, jobs=(record("j1", 10, 11), record("j2", 20)))
    save_state(path, state)
    assert load_state(path, A) == state
    assert [p.name for p in path.parent.iterdir()] == ["executor-a.json"]  # no temp left
    with pytest.raises(StateError, match="not of b"):
        load_state(path, ServerId("b"))
    path.write_text('{"server_id": "a", "jobs": [{"cmd": 1}]}')
    with pytest.raises(StateError):
        load_state(path, A)


def test_stat_lines_are_read_past_any_command_name(tmp_path: Path) -> None:
    line = "77 (a (b) c) S 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0"
    assert parse_stat(line) == ("S", 77, 123456)
    me = start_time(os.getpid())
    assert me is not None and running(os.getpid(), me)
    assert not running(os.getpid(), me + 1)  # the pid of another, later process
    fake_stat(tmp_path, 5, "zombie", "Z", 5, 99)
    fake_stat(tmp_path, 6, "alive", "S", 5, 100)
    fake_stat(tmp_path, 7, "other", "R", 7, 101)
    assert not running(5, 99, tmp_path) and running(6, 100, tmp_path)
    assert not running(8, 1, tmp_path)  # no such process
    assert group_members(5, tmp_path) == [6]  # a zombie is not running


def test_a_process_that_ended_is_not_running_any_more() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = start_time(proc.pid)
    assert started is not None
    proc.wait()
    assert not running(proc.pid, started)


def test_triage_adopts_a_job_only_with_all_its_processes() -> None:
    jobs = (record("whole", 10, 11), record("half", 20, 21), record("none", 30))
    alive = {10, 11, 21}
    adopt, gone = triage(jobs, lambda r: r.pid in alive)
    assert [j.cmd.job_id for j in adopt] == ["whole"]
    assert [j.cmd.job_id for j in gone] == ["half", "none"]


def test_ranks_share_a_group_of_their_own_and_are_pinned(tmp_path: Path) -> None:
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    plan = [RankLaunch(local_rank=k, argv=sleeper, env=dict(os.environ), cwd=str(tmp_path),
                       log=tmp_path / f"rank{k}.log", cpus=(0,) if k == 0 else ())
            for k in range(2)]
    ranks, pgid = start_ranks(plan, "start k of job j on a (run)")
    try:
        assert pgid == ranks[0].pid != os.getpgid(0)
        assert [os.getpgid(r.pid) for r in ranks] == [pgid, pgid]
        assert os.sched_getaffinity(ranks[0].pid) == {0}
        assert group_members(pgid) == sorted(r.pid for r in ranks)
        assert (tmp_path / "rank1.log").read_text().startswith("==== ")
        assert all(r.ended() == (False, None) for r in ranks)
    finally:
        signal_group(pgid, signal.SIGKILL)
        for r in ranks:
            r.proc.wait()
    assert [r.ended() for r in ranks] == [(True, -9), (True, -9)]
    with pytest.raises(LaunchError, match="No such file"):
        start_ranks([RankLaunch(0, (str(tmp_path / "nothing"),), {}, None,
                                tmp_path / "x.log")], "start")
    assert "cannot start" in (tmp_path / "x.log").read_text()
