"""Job logs through the whole live system: nats-server, every service and a
REAL executor running jobs' own commands (CPU jobs of ``python -c``).

``hops logs -f`` (the CLI, a real subprocess) follows a job's output to its
end and exits 0; the lines are still there after the executor is killed
with SIGKILL and after the job ended; a job flooding its output is capped
(the marker is in its log) while the other job's lines keep coming on
time and its node keeps beating.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from shared import subjects
from shared.jobkeys import job_key
from shared.logs import MARKER_PREFIX
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = """\
name: logs-local
gpu_types:
  - {name: cpu, link_bandwidth: 2.5e8, net_bandwidth: 5.0e8, overlap_residual: 1.0}
servers:
  - {id: local-a, gpu_type: cpu, gpus: 1, cores: 2}
"""
CHATTY = ("import time\nfor i in range(50):\n"
          "    print(f'line {i}', flush=True)\n    time.sleep(0.1)\n")
# 30 MB as fast as Python prints it: far past the cap's burst and rate.
FLOOD = ("import sys\nw = sys.stdout.write\nfor i in range(300000):\n"
         "    w(f'flood {i:08d} ' + 'x' * 80 + '\\n')\n")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LiveStack]:
    env = {"HOPS_STOP_GRACE_S": "5", "HOPS_ALLOW_ROOT_JOBS": "1"}
    with LiveStack(tmp_path, CLUSTER, env=env, executor="real", schedulers=1,
                   policy="coda:subarrays=false") as s:
        yield s


def cpu_job(job_id: str, script: str) -> dict[str, Any]:
    return {"id": job_id, "model": "cpu", "batch_size": 1, "params": 1, "total_samples": 1,
            "kind": "cpu", "cores": 1, "command": [sys.executable, "-c", script],
            "workdir": str(ROOT)}


def hops(stack: LiveStack, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(hops_argv(stack, *args), capture_output=True, text=True,
                          timeout=timeout, env=hops_env(stack), cwd=ROOT)


def hops_argv(stack: LiveStack, *args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args, "--gateway",
            f"http://127.0.0.1:{stack.config.gateway_port}"]


def hops_env(stack: LiveStack) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HOPS_TOKEN": stack.admin_token}


def printed(lines: list[str]) -> list[str]:
    """The job's own lines (the executor's header quotes the script)."""
    return [line for line in lines if line.startswith("line ")]


def accounted(lines: list[dict[str, Any]]) -> tuple[int, int]:
    """Bytes of the job's log lines shipped (the executor's header of the start
    and the job's own), and bytes its markers say dropped."""
    shipped = sum(len(x["text"].encode()) + 1 for x in lines if not x["capped"])
    return shipped, sum(int(x["text"].split()[3]) for x in lines if x["capped"])


def logs_json(stack: LiveStack, job_id: str) -> list[dict[str, Any]]:
    import httpx

    answer = httpx.get(f"http://127.0.0.1:{stack.config.gateway_port}/jobs/{job_id}/logs",
                       headers=stack.headers, timeout=30.0)
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line]


def test_logs_follow_a_job_to_its_end_and_outlive_its_executor(stack: LiveStack) -> None:
    assert stack.submit(cpu_job("chat", CHATTY))["ok"] is True
    until(lambda: stack.phase("chat") in ("running", "finished"), "chat started", 90,
          stack.logs)
    follow = subprocess.Popen(hops_argv(stack, "logs", "chat", "-f"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=hops_env(stack), cwd=ROOT)
    out, err = follow.communicate(timeout=90)
    assert follow.returncode == 0, err
    # The executor's header of each start (it quotes the command: several lines), then
    # the job's own lines.
    assert out.startswith("==== ") and " start " in out.splitlines()[0]
    assert printed(out.splitlines()) == [f"line {i}" for i in range(50)]
    assert stack.phase("chat") == "finished"
    # The node goes away: its job's output stays readable.
    os.kill(stack.executor_pid("local-a"), signal.SIGKILL)
    after = hops(stack, "logs", "chat", "--tail", "3")
    assert after.returncode == 0, after.stderr
    assert after.stdout.splitlines() == ["line 47", "line 48", "line 49"]
    rank0 = hops(stack, "logs", "chat", "--rank", "0", "--since", "1h")
    assert printed(rank0.stdout.splitlines()) == [f"line {i}" for i in range(50)]
    missing = hops(stack, "logs", "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr


def test_a_flooding_job_is_capped_and_slows_no_other(stack: LiveStack) -> None:
    beats: list[float] = []

    async def on_beat(_msg: Msg) -> None:
        beats.append(time.monotonic())

    bus = stack.bus_()
    bus.call(bus.nc.subscribe(subjects.node_heartbeat("local-a"), cb=on_beat))
    assert stack.submit(cpu_job("chat", CHATTY.replace("50", "80")))["ok"] is True
    until(lambda: stack.phase("chat") == "running", "chat running", 90, stack.logs)
    assert stack.submit(cpu_job("flood", FLOOD))["ok"] is True
    stack.wait_final(["chat", "flood"], 120)
    # The node beat every second (HOPS_HEARTBEAT_S) all along.
    assert max(b - a for a, b in itertools.pairwise(beats)) < 2.0
    # What the rank's file holds: the executor's header of the start (which a
    # shipper that starts late skips with the flood) and the job's 28.8 MB.
    (log_file,) = [p for p in stack.root.rglob("*-rank0.log") if p.parent.parent.name == "flood"]
    written = log_file.stat().st_size
    assert written > sum(len(f"flood {i:08d} ") + 81 for i in range(300000))
    # Every byte either shipped or counted dropped, once the executor is done with it.
    until(lambda: sum(accounted(logs_json(stack, "flood"))) == written,
          "the flood accounted for", 30, stack.logs)
    flood = logs_json(stack, "flood")
    markers = [x for x in flood if x["capped"]]
    assert markers and all(x["text"].startswith(MARKER_PREFIX) for x in markers)
    shipped, _ = accounted(flood)
    assert shipped < 4 * 1024 * 1024  # the burst and the rate over the run, not 29 MB
    chat = logs_json(stack, "chat")
    chat = [x for x in chat if x["text"].startswith("line ")]
    assert [x["text"] for x in chat] == [f"line {i}" for i in range(80)]
    ats = [x["at"] for x in chat]
    # Shipped every half second while the flood ran: no gap of 2 s between reads.
    assert max(b - a for a, b in itertools.pairwise(ats)) < 2.0
    assert stack.phase("chat") == "finished" and stack.phase("flood") == "finished"


EMULATED = """\
name: logs-emulated
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 2}
"""
TENANTS = """\
tenants:
  alice: {tokens: ["alice-token"]}
  bob: {tokens: ["bob-token"]}
"""


def test_emulated_jobs_show_a_training_log_to_their_tenant_only(tmp_path: Path) -> None:
    import httpx

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    alice, bob = ({"Authorization": f"Bearer {who}-token"} for who in ("alice", "bob"))
    with LiveStack(tmp_path / "stack", EMULATED, tenants=tenants, schedulers=1) as stack, \
            httpx.Client(base_url=stack.config.gateway_url, timeout=30) as api:
        answer = api.post("/jobs", json=catalog_spec("emu", 30_000_000, requirements=[1]),
                          headers=alice)
        assert answer.status_code == 201, answer.text
        until(lambda: stack.phase(job_key("alice", "emu")) == "finished", "emu finished", 120,
              stack.logs)
        until(lambda: "[emulated] finished" in api.get("/jobs/emu/logs", headers=alice).text,
              "the last line shipped", 10, stack.logs)
        texts = [json.loads(x)["text"] for x in
                 api.get("/jobs/emu/logs", headers=alice).text.splitlines()]
        refused = api.get("/jobs/emu/logs", headers=bob)
    assert texts[0].startswith("[emulated] profiling") and texts[-1].startswith(
        "[emulated] finished")
    assert any(t.startswith("[emulated] training") for t in texts)
    assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
    assert "emulated" not in refused.text
