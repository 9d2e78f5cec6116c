"""The example training scripts under the plugin, run as a node executor runs
them: real processes with the job's environment (shared/jobenv.py), a temp
report file and checkpoint folder, DDP over gloo with a free port, SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from shared.jobreport import (
    AnyReport,
    Checkpointed,
    Finished,
    Profiled,
    Progress,
    Sampled,
    Started,
    decode_line,
)
from tests.helpers import free_port

R = TypeVar("R")
ROOT = Path(__file__).resolve().parents[1]
_LAUNCH = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def job_env(tmp_path: Path, mode: str, total: int, rank: int = 0, world: int = 1,
            port: int = 0, **extra: str) -> dict[str, str]:
    """What the executor gives one process; with several ranks each is its
    own node (local rank 0, its own report file), as on several servers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOPS_") and k not in _LAUNCH}
    env.update({
        "PYTHONPATH": str(ROOT), "HOPS_JOB_ID": "job-1", "HOPS_SERVER_ID": f"s{rank}",
        "HOPS_GPU_TYPE": "cpu", "HOPS_MODE": mode, "HOPS_TOTAL_SAMPLES": str(total),
        "HOPS_REPORT_FILE": str(tmp_path / f"report-{rank}.jsonl"),
        "HOPS_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "HOPS_SAMPLE_S": "0.2",
        "HOPS_PROFILE_ITERS": "10", "HOPS_THREADS": "1", "HOPS_TOTAL_GPUS": str(world),
        "HOPS_NODES": str(world), "HOPS_NODE_RANK": str(rank), "HOPS_LOCAL_GPUS": "1",
        "WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    env.update(extra)
    return env


class Job:
    """One process of an example script, logging to a file."""

    def __init__(self, tmp_path: Path, script: str, env: dict[str, str], *args: str) -> None:
        self.report = Path(env["HOPS_REPORT_FILE"])
        self.log = tmp_path / f"{self.report.stem}.log"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "examples" / script), *args], env=env, cwd=ROOT,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def lines(self) -> list[AnyReport]:
        if not self.report.exists():
            return []
        raw = [r for r in self.report.read_bytes().splitlines() if r.endswith(b"}")]
        decoded = [decode_line(r) for r in raw]
        assert None not in decoded, raw
        return [d for d in decoded if d is not None]

    def wait(self, timeout: float = 90.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.report.stem} did not exit; log:\n{self.log.read_text()[-3000:]}")

    def ok(self) -> None:
        code = self.wait()
        assert code == 0, f"exit code {code}; log:\n{self.log.read_text()[-3000:]}"


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:  # a failed test leaves nothing running
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def of(kind: type[R], got: list[AnyReport]) -> list[R]:
    return [x for x in got if isinstance(x, kind)]


def test_profiling_mode_writes_one_profile(tmp_path: Path, jobs: list[Job]) -> None:
    env = job_env(tmp_path, "profile", 10**6)
    jobs.append(Job(tmp_path, "train_cnn.py", env, "--workers", "1"))
    jobs[0].ok()
    (profiled,) = got = jobs[0].lines()
    assert isinstance(profiled, Profiled), got
    m = profiled.modules
    assert min(m.t_f, m.t_b, m.t_u) > 0 and profiled.iterations == 10
    assert len(m.t_d) == len(m.t_w) == 10 and min(m.t_d) > 0
    # A loader worker makes the batches while the loop computes: pattern 1.
    assert m.pattern == 1
    # Its 114 k parameters (455 KB) fit DDP's 1 MiB first bucket; no buffers.
    assert (m.buckets, m.broadcasts, m.agreement) == (1, 0, True)
    assert not (tmp_path / "ckpt").exists()


def test_profile_counts_the_collectives_of_a_data_parallel_iteration(
    tmp_path: Path, jobs: list[Job]
) -> None:
    jobs.append(Job(tmp_path, "train_lm.py", job_env(tmp_path, "profile", 10**6)))
    jobs[0].ok()
    (profiled,) = jobs[0].lines()
    assert isinstance(profiled, Profiled)
    # 339 k parameters (1.36 MB) overflow the 1 MiB first bucket: two
    # all-reduces; its causal mask is a buffer, broadcast every forward.
    m = profiled.modules
    assert (m.buckets, m.broadcasts, m.agreement) == (2, 1, True)


def test_running_mode_reports_and_finishes(tmp_path: Path, jobs: list[Job]) -> None:
    # 150 samples at 16 a step: 10 steps, the last one cut short.
    jobs.append(Job(tmp_path, "train_lm.py", job_env(tmp_path, "run", 150)))
    jobs[0].ok()
    got = jobs[0].lines()
    assert isinstance(got[0], Started) and got[0].samples_done == 0 and not got[0].checkpoint
    sampled = of(Sampled, got)
    assert sampled and all(s.per_gpu_throughput > 0 and s.data_times for s in sampled)
    progress = [p.samples_done for p in of(Progress, got)]
    assert progress == sorted(progress) and progress[-1] == 150
    assert isinstance(got[-1], Finished) and got[-1].samples_done == 150
    assert all(x.samples_done <= 150 for x in got if not isinstance(x, Profiled))


def test_sigterm_checkpoints_and_a_new_start_resumes(tmp_path: Path, jobs: list[Job]) -> None:
    env = job_env(tmp_path, "run", 10**6)
    jobs.append(Job(tmp_path, "train_cnn.py", env, "--workers", "1"))
    wait_until("a progress line", lambda: bool(of(Progress, jobs[0].lines())))
    os.killpg(jobs[0].proc.pid, signal.SIGTERM)  # the executor signals the whole group
    jobs[0].ok()
    first = jobs[0].lines()
    stop = first[-1]
    assert isinstance(stop, Checkpointed) and stop.samples_done > 0, first
    assert Path(stop.path).is_file() and Path(stop.path).parent == tmp_path / "ckpt"

    total = int(stop.samples_done) + 64
    env = job_env(tmp_path, "run", total, HOPS_SAMPLES_DONE="0")  # the checkpoint wins
    jobs.append(Job(tmp_path, "train_cnn.py", env))
    jobs[1].ok()
    second = jobs[1].lines()[len(first):]
    assert isinstance(second[0], Started), second
    assert second[0].samples_done == stop.samples_done and second[0].checkpoint == stop.path
    assert isinstance(second[-1], Finished) and second[-1].samples_done == total


def two_ranks(tmp_path: Path, jobs: list[Job], script: str, total: int) -> None:
    port = free_port()
    for rank in (0, 1):
        env = job_env(tmp_path, "run", total, rank=rank, world=2, port=port)
        jobs.append(Job(tmp_path, script, env))


def test_two_ranks_over_gloo_finish_and_measure_waits(tmp_path: Path, jobs: list[Job]) -> None:
    two_ranks(tmp_path, jobs, "train_lm.py", 256)  # 32 a step over both ranks
    for job in jobs:
        job.ok()
    for job in jobs:
        got = job.lines()
        assert isinstance(got[0], Started) and got[0].world_size == 2
        assert isinstance(got[-1], Finished) and got[-1].samples_done == 256
        sampled = of(Sampled, got)
        waits = [w for s in sampled for w in s.wait_times]
        comms = [c for s in sampled for c in s.comm_times]
        assert waits and min(waits) >= 0 and max(waits) > 0
        assert len(comms) == len(waits) and min(comms) > 0


def test_sigterm_to_one_rank_stops_both_at_the_same_iteration(
    tmp_path: Path, jobs: list[Job]
) -> None:
    two_ranks(tmp_path, jobs, "train_lm.py", 10**6)
    wait_until("progress on both ranks", lambda: all(of(Progress, j.lines()) for j in jobs))
    os.kill(jobs[1].proc.pid, signal.SIGTERM)  # only the second node is told
    for job in jobs:
        job.ok()
    lead, other = (job.lines() for job in jobs)
    assert isinstance(lead[-1], Checkpointed)  # global rank 0 saves the job
    assert (tmp_path / "ckpt" / "latest.pt").is_file()
    assert not of(Checkpointed, other) and not of(Finished, lead + other)
    last = [of(Progress, got)[-1] for got in (lead, other)]
    assert last[0].iterations == last[1].iterations
    assert lead[-1].samples_done == last[0].samples_done
