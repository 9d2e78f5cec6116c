"""The runner a real job's Slurm batch job runs (executor/slurm/runner.py),
as a real subprocess, without Slurm: it starts one process per launch with
Slurm's GPUs, says ``ready`` and then how each ended, passes SIGTERM on,
and a failing process takes the others down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from executor.launch import RankLaunch
from executor.slurm.runner import launch_file

ROOT = Path(__file__).resolve().parents[1]


def write_plan(tmp: Path, codes: list[str], grace: float = 5.0) -> Path:
    ranks = [RankLaunch(local_rank=k, argv=(sys.executable, "-c", code),
                        env={"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "0,1"},
                        cwd=str(tmp), log=tmp / f"rank{k}.log") for k, code in enumerate(codes)]
    path = tmp / "launch.json"
    path.write_bytes(launch_file("test start", ranks, 12.0, grace))
    return path


def runner(plan: Path, gpus: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": gpus}
    return subprocess.Popen([sys.executable, "-m", "executor.slurm.runner", str(plan)],
                            stdout=subprocess.PIPE, text=True, env=env)


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_processes_run_with_slurms_gpus_and_their_exits_are_said(tmp_path: Path) -> None:
    show = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    proc = runner(write_plan(tmp_path, [show, show + "; raise SystemExit(0)"]), "5,7")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    said = lines(out)
    assert [s["event"] for s in said] == ["ready", "exited"], said
    assert said[0]["samples_done"] == 12.0 and said[1]["exits"] == {"0": 0, "1": 0}
    for k in (0, 1):  # Slurm's choice, not the plan's
        assert (tmp_path / f"rank{k}.log").read_text().strip().endswith("5,7")


def test_sigterm_reaches_the_processes(tmp_path: Path) -> None:
    wait = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
            "print('up', flush=True); time.sleep(60)")
    proc = runner(write_plan(tmp_path, [wait, wait]), "0")
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["event"] == "ready"
    deadline = time.monotonic() + 20
    # A line of its own: the log's header line quotes the code, "up" included.
    while not all("up" in (tmp_path / f"rank{k}.log").read_text().splitlines()
                  for k in (0, 1)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert lines(out)[-1]["exits"] == {"0": 0, "1": 0}


def test_a_failing_process_takes_the_others_down(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, ["raise SystemExit(3)", "import time; time.sleep(60)"],
                      grace=1.0)
    started = time.monotonic()
    proc = runner(plan, "0")
    out, _ = proc.communicate(timeout=30)
    assert time.monotonic() - started < 20
    assert lines(out)[-1]["exits"] == {"0": 3, "1": -signal.SIGTERM}
