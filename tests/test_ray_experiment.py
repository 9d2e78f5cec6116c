"""``hops experiment … --ray ADDRESS`` on a real Ray cluster (issue 36): a
head started by ``ray start --head`` on loopback, the reduced sharing
experiment of tests/test_sharing.py through it by the ``hops`` command in a
subprocess, and every result equal to the local run's to the last digit
(wall times aside). Ray is the ``ray`` extra: without it the test is
skipped, saying so (failed under ``CI=true``)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import require
from tests.test_sharing import _trace

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).parent / "ray"  # the console script beside this Python
HAS_RAY = importlib.util.find_spec("ray") is not None and RAY.is_file()
# Ray advertises the machine's external address unless this is 0 (issue 36).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Outputs that differ between any two runs: the simulations' wall times.
WALL = ("wall_s",)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def ray_head() -> Iterator[str]:
    """An existing Ray cluster: a head of 2 CPUs on loopback, its address."""
    require("Ray", HAS_RAY, "install hops-scheduler[ray] (make test's dev extra has it)")
    address = f"127.0.0.1:{_free_port()}"
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths have a length limit
    # --block keeps `ray start` in the foreground as the parent of what it
    # starts, so that the test stops this head alone (`ray stop` stops every
    # Ray on the machine).
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", "--port", address.split(":")[1],
         "--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--include-dashboard", "false",
         "--disable-usage-stats", "--temp-dir", temp],
        env={**os.environ, **LOOPBACK}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        _wait_for_port(address, head)
        yield address
    finally:
        _stop(head)


def _wait_for_port(address: str, head: subprocess.Popen[bytes]) -> None:
    host, port = address.split(":")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if head.poll() is not None:
            err = head.stderr.read().decode() if head.stderr else ""
            pytest.fail(f"ray start exited {head.returncode}: {err[-2000:]}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"the Ray head did not listen on {address} within 60 s")


def _stop(head: subprocess.Popen[bytes]) -> None:
    """The head and everything it started (its own process group)."""
    if head.poll() is None:
        head.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)  # what outlived the head, if anything
    head.wait(timeout=10)


def _hops(*args: str, code: str = "") -> subprocess.CompletedProcess[str]:
    """The ``hops`` command in a subprocess, after ``code`` (run first)."""
    main = f"{code}\nfrom cli.main import app\napp()"
    env = {**os.environ, **LOOPBACK, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", main, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=False)


def _sharing(out: Path, traces: str, *extra: str) -> list[str]:
    return ["experiment", "sharing", "--out", str(out), "--traces", traces,
            "--first-n", "16", "--no-progress", *extra]


def _without_wall(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_wall(v) for k, v in value.items() if k not in WALL}
    return value


def _traces(tmp_path: Path) -> str:
    a = _trace(tmp_path / "ta.csv", [(f"a{i}", 60 * i, 8 if i % 3 == 0 else 1, 900)
                                     for i in range(12)])
    b = _trace(tmp_path / "tb.csv", [(f"b{i}", 30 + 60 * i, 1, 600) for i in range(12)])
    return f"{a},{b}"


def test_sharing_on_ray_equals_the_local_run_to_the_last_digit(
        ray_head: str, tmp_path: Path) -> None:
    traces = _traces(tmp_path)
    here, there = tmp_path / "here", tmp_path / "ray"
    local = _hops(*_sharing(here, traces))
    assert local.returncode == 0, local.stderr
    remote = _hops(*_sharing(there, traces, "--ray", ray_head))
    assert remote.returncode == 0, remote.stderr
    ours, theirs = (json.loads((d / "results.json").read_text()) for d in (here, there))
    assert set(ours) == {"hived", "hived-opportunistic", "quota", "quota-borrow", "shared",
                         "private"}
    assert _without_wall(theirs) == _without_wall(ours)
    tables = sorted(p.relative_to(here) for p in here.glob("*/jobs.csv"))
    assert len(tables) == 6
    for name in [*tables, Path("workload.json"), Path("cells.yaml")]:
        assert (there / name).read_bytes() == (here / name).read_bytes(), name


def test_a_missing_ray_is_refused_with_its_code_before_any_work(tmp_path: Path) -> None:
    # A name set to None in sys.modules makes `import ray` raise ImportError.
    out = tmp_path / "out"
    done = _hops(*_sharing(out, _traces(tmp_path), "--ray", "auto"),
                 code="import sys\nsys.modules['ray'] = None")
    assert done.returncode == 2, done.stderr
    assert "error (ray_missing): --ray needs Ray" in done.stderr
    assert not out.exists()


def test_no_cluster_is_refused_with_its_code(tmp_path: Path) -> None:
    require("Ray", HAS_RAY, "install hops-scheduler[ray] (make test's dev extra has it)")
    # An empty temp folder holds no running cluster for `auto` to find.
    done = _hops("experiment", "coda", "--out", str(tmp_path / "out"), "--first-n", "5",
                 "--no-progress", "--ray", "auto",
                 code=f"import os\nos.environ['RAY_TMPDIR'] = {str(tmp_path)!r}\n"
                 "os.environ.pop('RAY_ADDRESS', None)")
    assert done.returncode == 2, done.stderr
    assert "error (ray_unreachable): no Ray cluster at 'auto' answered" in done.stderr


def test_an_address_where_nothing_listens_is_refused_at_once(tmp_path: Path) -> None:
    require("Ray", HAS_RAY, "install hops-scheduler[ray] (make test's dev extra has it)")
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    done = _hops("experiment", "coda", "--out", str(tmp_path / "out"), "--first-n", "5",
                 "--no-progress", "--ray", f"127.0.0.1:{port}")
    assert done.returncode == 2, done.stderr
    assert f"error (ray_unreachable): no Ray cluster at '127.0.0.1:{port}' answered" \
        in done.stderr
    assert time.monotonic() - started < 60  # not ray.init's minutes of retries
