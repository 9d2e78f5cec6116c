"""Finding an emulated job's processes by their command line."""

from __future__ import annotations

from pathlib import Path

from executor.procs import emulated_job_pids


def fake_proc(root: Path, pid: int, *argv: str) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")


def test_matches_the_job_id_exactly_and_the_role_when_given(tmp_path: Path) -> None:
    job = ("python", "-m", "executor.job", "--job-id")
    fake_proc(tmp_path, 10, *job, "a", "--role", "lead")
    fake_proc(tmp_path, 11, *job, "a", "--role", "worker")
    fake_proc(tmp_path, 12, *job, "ab", "--role", "lead")  # a longer id, not "a"
    fake_proc(tmp_path, 13, "python", "-m", "executor", "--job-id", "a")  # not a job process
    (tmp_path / "self").mkdir()  # not a pid
    assert emulated_job_pids("a", proc=tmp_path) == [10, 11]
    assert emulated_job_pids("a", "worker", proc=tmp_path) == [11]
    assert emulated_job_pids("missing", proc=tmp_path) == []
