"""``hops up`` and the ``hops`` commands that talk to the gateway.

One ``hops up`` (a real subprocess: nats-server, every service, the gateway
and a two-server EMULATED cluster) serves the tests of this module; the last
one stops it with SIGINT and checks that every process is gone and the ports
are free. Tests that need no stack run always; the stack tests skip, saying
which, while a service module is missing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.client import Answer, render_answer, render_jobs, render_nodes, render_queue
from cli.main import app
from cli.up.launcher import Launcher
from cli.up.stack import Component, StackConfig, by_name, modules, processes
from cli.up.up import missing_modules, wait_healthy
from services.runtime.natsd import EmbeddedNats
from tests.helpers import free_port
from tests.upstack import UpProcess, hops_up

MISSING = missing_modules(modules())
needs_stack = pytest.mark.skipif(
    bool(MISSING), reason=f"the live system is incomplete: cannot run {', '.join(MISSING)}"
)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def gone(pid: int) -> bool:
    """Whether neither the process nor anything in its process group is left."""
    for probe in (os.kill, os.killpg):
        try:
            probe(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            return False
        return False
    return True


def until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.2)


def hops(*args: str, gateway: str | None = None, up: UpProcess | None = None) -> Any:
    """The CLI against ``gateway``, or as the admin of the ``hops up`` ``up``."""
    env = {"HOPS_GATEWAY_URL": gateway} if gateway else {}
    if up is not None:
        env = {"HOPS_GATEWAY_URL": up.gateway, "HOPS_TOKEN": up.admin_token or ""}
    return CliRunner().invoke(app, list(args), env=env)


# --- without a stack ---------------------------------------------------------------------


def test_commands_say_clearly_when_no_gateway_answers() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["jobs"], ["queue"], ["nodes"], ["cancel", "j1"]):
        result = hops(*args, gateway=url)
        assert result.exit_code == 1, args
        assert f"cannot reach the Hops gateway at {url}" in result.output
        assert "HOPS_GATEWAY_URL" in result.output


def test_renderings_of_the_gateway_answers() -> None:
    assert render_answer("j1", Answer(201, {"ok": True, "job_id": "j1"})) == "j1: accepted"
    refused = Answer(409, {"ok": False, "code": "conflict", "error": "job j1 exists"})
    assert render_answer("j1", refused) == "j1: rejected (409 conflict): job j1 exists"
    job = {"job_id": "j1", "phase": "running", "spec": {"model": "m", "total_samples": 200},
           "samples_done": 50.0, "configuration": {"parts": [["s0", 2], ["s1", 1]]},
           "restarts": 1, "reason": ""}
    lines = render_jobs({"jobs": [job]}).splitlines()
    assert lines[0].split() == ["job", "tenant", "phase", "model", "done", "gpus", "submitted",
                                "waited", "ran", "restarts", "reason"]
    assert lines[1].split() == ["j1", "-", "running", "m", "25.0%", "s0:2", "s1:1", "-", "-",
                                "-", "1"]
    assert render_jobs({"jobs": []}) == "no jobs"
    queue = {"leader": "r1", "term": 3, "entries": [
        {"job_id": "a", "priority": 2.5, "latency_ratio": "inf", "in_window": True}]}
    assert render_queue(queue).splitlines()[0] == "leader r1, term 3"
    assert render_queue(queue).splitlines()[2].split() == ["1", "a", "2.5", "inf", "yes"]
    nodes = {"servers": [{"id": "s0", "gpu_type": "T", "gpus": 4, "used": 1, "free": 3,
                          "alive": False, "jobs": ["a"]}],
             "totals": {"servers": 1, "alive_servers": 0, "gpus": 4, "used": 1, "free": 3},
             "double_booked": [{"server_id": "s0", "gpu": 0, "jobs": ["a", "b"]}]}
    text = render_nodes(nodes)
    assert "s0" in text and " NO " in text and "0/1 servers alive" in text
    assert "WARNING double booked" in text


def test_submit_stops_on_a_bad_jobs_file(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.yaml"
    bad.write_text("jobs:\n  - {id: a, model: m}\n")
    result = hops("submit", str(bad), gateway="http://127.0.0.1:1")
    assert result.exit_code == 1 and "jobs.yaml: jobs[0] (id 'a'), field " in result.output
    assert "nothing sent" in result.output


def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = hops("up", "--data-dir", str(tmp_path), "--gateway-port", str(port),
                      "--metrics-port", str(free_port()), "--nats-port", "0")
    assert result.exit_code == 1
    assert f"port {port} (gateway) is in use" in result.output
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_launcher_restarts_the_dead_and_stops_process_groups(tmp_path: Path) -> None:
    """The launcher of ``hops up`` with the real gateway and a plain second process."""
    say: list[str] = []
    with EmbeddedNats(tmp_path / "nats") as nats:
        config = StackConfig(data_dir=tmp_path, nats_url=nats.url, gateway_port=free_port(),
                             auth=False)  # a plain server: the launcher is under test
        launcher = Launcher(config, say.append, grace=10)
        other = launcher.start(Component("web", "http.server", ("0", "--bind", "127.0.0.1")))
        gateway = launcher.start(by_name(config)["gateway"])
        first = other.proc.pid
        try:
            wait_healthy(launcher, gateway, timeout=30)
            os.kill(first, signal.SIGKILL)
            until(lambda: launcher.tick(time.monotonic()), "the death noticed", 10)
            assert say == [f"hops up: web was killed by signal 9; see {tmp_path}/logs/web.log; "
                           "restarting it in 1 s"]
            until(lambda: launcher.tick(time.monotonic()) == [] and other.proc.pid != first,
                  "the restart", 10)
            assert other.proc.poll() is None and other.groups == [first, other.proc.pid]
        finally:
            launcher.stop()
    assert gateway.proc.returncode == 0  # a clean stop on SIGTERM
    assert gone(gateway.proc.pid) and gone(first) and gone(other.proc.pid)
    assert say[1:] == [f"hops up: web exited with -15 while stopping; see {tmp_path}/logs/web.log"]
    assert '"service": "gateway"' in (tmp_path / "logs" / "gateway.log").read_text()


# --- a whole stack -----------------------------------------------------------------------


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    if MISSING:
        pytest.skip(f"the live system is incomplete: cannot run {', '.join(MISSING)}")
    with hops_up(tmp_path_factory.mktemp("up")) as up:
        yield up


@needs_stack
def test_up_prints_where_the_gateway_and_metrics_are(stack: UpProcess) -> None:
    text = stack.out.read_text()
    assert f"gateway  {stack.gateway}" in text and f"metrics  {stack.metrics}" in text
    assert _healthy(stack.gateway)
    state = stack.state()
    assert set(state["components"]) == {c.name for c in processes(StackConfig())}
    assert {"scheduler-1", "scheduler-2"} <= set(state["components"])  # a leader and a standby
    assert not gone(state["components"]["gateway"]["pid"])
    assert state["nats"]["url"] == f"nats://127.0.0.1:{stack.nats_port}"


@needs_stack
def test_nodes_lists_the_emulated_servers(stack: UpProcess) -> None:
    def alive() -> bool:
        result = hops("nodes", "--json", up=stack)
        return result.exit_code == 0 and json.loads(result.output)["totals"]["alive_servers"] == 2

    until(alive, "both servers registered", 30)
    result = hops("nodes", up=stack)
    assert result.exit_code == 0
    assert "rtx-0" in result.output and "rtx-1" in result.output
    assert "2/2 servers alive" in result.output


@needs_stack
def test_submit_list_queue_and_cancel(stack: UpProcess, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n"
        "  - {id: big-a, model: resnet50-imagenet, batch_size: 128, params: 25557032,\n"
        "     total_samples: 1000000000, requirements: [1, 2]}\n"
        "  - {id: big-b, model: vgg11-imagenet, batch_size: 32, params: 132863336,\n"
        "     total_samples: 1000000000, min_gpus: 1, max_gpus: 4}\n"
    )
    result = hops("submit", str(jobs), up=stack)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["big-a: accepted", "big-b: accepted"]
    again = hops("submit", str(jobs), up=stack)  # the same file again: nothing new
    assert again.exit_code == 0, again.output
    assert again.output.splitlines() == ["big-a: accepted", "big-b: accepted"]
    jobs.write_text(jobs.read_text().replace("batch_size: 128", "batch_size: 64"))
    changed = hops("submit", str(jobs), up=stack)
    assert changed.exit_code == 1 and "big-a: rejected (409 conflict)" in changed.output

    listed = hops("jobs", up=stack)
    assert listed.exit_code == 0 and "big-a" in listed.output and "big-b" in listed.output
    bad = hops("jobs", "--phase", "bogus", up=stack)
    assert bad.exit_code == 1 and "unknown phase 'bogus'" in bad.output
    until(lambda: hops("queue", up=stack).exit_code == 0, "the queue view", 30)
    assert "leader" in hops("queue", up=stack).output

    cancelled = hops("cancel", "big-b", "--reason", "test", up=stack)
    assert cancelled.exit_code == 0 and cancelled.output.strip() == "big-b: cancelled"
    ghost = hops("cancel", "ghost", up=stack)
    assert ghost.exit_code == 1 and "404 not_found" in ghost.output

    def phase(job_id: str) -> str:
        return str(httpx.get(f"{stack.gateway}/jobs/{job_id}", timeout=5,
                                 headers=stack.headers).json()["phase"])

    until(lambda: phase("big-b") == "cancelled", "big-b cancelled", 30)


@needs_stack
def test_a_submitted_job_is_profiled_runs_and_finishes(stack: UpProcess) -> None:
    """End to end: admission, profiling on both GPU types (§3.2), a plan, the
    placer, an emulated run at 600x, and the finish."""
    with httpx.Client(base_url=stack.gateway, timeout=5, headers=stack.headers) as client:
        spec = {"id": "small", "model": "resnet18-cifar10", "batch_size": 128,
                "params": 11689512, "total_samples": 2_000_000, "requirements": [1, 2]}
        assert client.post("/jobs", json=spec).status_code == 201
        seen: list[str] = []

        def ended() -> dict[str, Any] | None:
            record: dict[str, Any] = client.get("/jobs/small").json()
            if not seen or seen[-1] != record["phase"]:
                seen.append(record["phase"])
            return record if record["phase"] in ("finished", "failed", "cancelled") else None

        record = until(ended, "the job ended", 90)
    assert record["phase"] == "finished", f"{record}\nphases {seen}\n{stack.logs()}"
    assert record["first_start"] is not None and record["finished_at"] is not None


@needs_stack
def test_jobs_shows_times_and_sorts(stack: UpProcess) -> None:
    """After the job above finished: ``hops jobs`` shows its tenant and times,
    which agree with its record, and ``--sort`` orders the live listing."""
    body = json.loads(hops("jobs", "--json", "--sort", "ran", up=stack).output)
    ran = [j["ran_s"] for j in body["jobs"]]
    assert ran == sorted(ran, reverse=True) and len(ran) >= 2
    small = next(j for j in body["jobs"] if j["job_id"] == "small")
    assert small["waited_s"] == pytest.approx(small["first_start"] - small["submitted_at"])
    assert small["ran_s"] == pytest.approx(small["finished_at"] - small["first_start"])
    assert small["ran_s"] > 0 and small["spec"]["tenant"] == "default"
    table = hops("jobs", "--sort", "id", up=stack)
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split()[:3] == ["job", "tenant", "phase"] and "waited" in lines[0]
    ids = [line.split()[0] for line in lines[1:]]
    assert ids == sorted(ids) and "small" in ids


@needs_stack
def test_every_line_the_services_write_is_json(stack: UpProcess) -> None:
    """After the scheduler has planned (the job above ran), the log of every
    service holds JSON objects only: no solver banner, no plain warning."""
    services = ("scheduler-1", "scheduler-2", "estimator", "profiler", "placer", "monitor")
    for name in (*services, "gateway"):
        log = stack.data_dir / "logs" / f"{name}.log"
        lines = log.read_text(errors="replace").splitlines()
        assert lines, name
        for line in lines:
            try:
                assert isinstance(json.loads(line), dict), line
            except json.JSONDecodeError:
                pytest.fail(f"{log.name}: not a JSON line: {line!r}")


def test_the_monitor_serves_metrics(stack: UpProcess) -> None:
    def metrics() -> str:
        try:
            r = httpx.get(stack.metrics, timeout=2)
        except httpx.HTTPError:
            return ""
        return r.text if r.status_code == 200 else ""

    text = until(metrics, "metrics", 30)
    assert "# TYPE" in text and "hops_" in text


@needs_stack
def test_up_stops_every_process_on_sigint(stack: UpProcess) -> None:
    """Last in this module: it stops the shared stack."""
    state = stack.state()
    pids = [c["pid"] for c in state["components"].values()]
    stack.proc.send_signal(signal.SIGINT)
    assert stack.proc.wait(60) == 0, stack.logs()
    assert "hops up: stopping" in stack.out.read_text()
    assert [p for p in pids if not gone(p)] == []
    assert port_free(stack.gateway_port) and port_free(stack.nats_port)
    assert not (stack.data_dir / "up.json").exists()
    # every process stopped cleanly on SIGTERM (exit 0, within the grace period)
    said = stack.out.read_text().split("hops up: stopping", 1)[1]
    assert "while stopping" not in said and "did not stop" not in said, stack.logs()
