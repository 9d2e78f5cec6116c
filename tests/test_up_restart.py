"""``hops up`` starts again right after Ctrl-C, on the same ports.

A stopped server leaves its closed connections in TIME_WAIT on its port for a
minute; the servers bind with SO_REUSEADDR and do not mind, so neither may
the port check of ``hops up`` (:func:`cli.up.launcher.port_free`). A live
listener still counts as in use.
"""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest

from cli.up.launcher import port_free
from cli.up.stack import modules
from cli.up.up import missing_modules
from tests.helpers import free_port
from tests.upstack import hops_up

MISSING = missing_modules(modules())
linux = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/net/tcp")
_TIME_WAIT = "06"  # the state column of /proc/net/tcp


def time_waits(port: int) -> int:
    """How many IPv4 sockets with local ``port`` are in TIME_WAIT."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        count += int(local.split(":")[1], 16) == port and state == _TIME_WAIT
    return count


def leave_time_wait() -> int:
    """A port with no listener left, only a connection in TIME_WAIT: the
    server's side closed first, as uvicorn does after ``Connection: close``."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port: int = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            served, _ = listener.accept()
            served.close()  # the server's active close: TIME_WAIT on ``port``
            assert client.recv(1) == b""
    return port


@linux
def test_a_port_with_only_time_wait_connections_is_free() -> None:
    port = leave_time_wait()
    assert time_waits(port) >= 1  # the case under test, not a port left idle
    assert port_free(port)


@pytest.mark.parametrize("reuse", [False, True])
def test_a_port_with_a_live_listener_is_not_free(reuse: bool) -> None:
    with socket.socket() as busy:
        if reuse:  # as uvicorn and nats-server bind
            busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert not port_free(busy.getsockname()[1])


def _closing_requests(url: str, count: int) -> None:
    """Requests on connections the gateway closes, so TIME_WAITs stay on its port."""
    for _ in range(count):
        with httpx.Client(timeout=5, headers={"Connection": "close"}) as client:
            assert client.get(f"{url}/healthz").status_code == 200


@linux
@pytest.mark.skipif(bool(MISSING), reason=f"the live system is incomplete: {MISSING}")
def test_up_starts_again_at_once_after_ctrl_c_on_the_same_ports(tmp_path: Path) -> None:
    ports = (free_port(), free_port(), free_port())
    with hops_up(tmp_path, ports=ports) as first:
        _closing_requests(first.gateway, 3)
        first.proc.send_signal(signal.SIGINT)
        assert first.proc.wait(60) == 0, first.logs()
    assert time_waits(first.gateway_port) >= 1, "no TIME_WAIT left: the test shows nothing"
    with hops_up(tmp_path, ports=ports) as second:
        assert second.gateway == first.gateway and second.nats_port == first.nats_port
        assert "is in use" not in second.said()
        assert httpx.get(f"{second.gateway}/healthz", timeout=5).status_code == 200
        answer = httpx.get(f"{second.gateway}/jobs", headers=second.headers, timeout=5)
        assert answer.status_code == 200, second.logs()
