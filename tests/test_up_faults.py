"""``hops up`` under faults: a real ``hops up`` subprocess (nats-server, every
service, two scheduler replicas, the gateway, a two-server EMULATED cluster;
rounds of 2 s, a 3 s lease, heartbeats every 1 s with a 3 s deadline) serves
every test of this module, in order:

- every listener binds loopback only (monitor, gateway, nats-server);
- the scheduler leader is SIGKILLed: submissions while the lease is vacant
  are accepted at once by the standby, and ``hops up`` restarts the dead one;
- both replicas are SIGKILLed: ``hops submit`` retries the 503 until a
  restarted replica accepts the job;
- nats-server is SIGKILLed: ``hops up`` restarts it on the same port and data
  dir, and every job accepted in this module is still there and finishes.

Before them, the keeper of nats-server alone: its restart backoff while
another process holds the port. docs/live.md (*Faults*) describes the
behaviour held here.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.up.stack import modules
from cli.up.up import NatsKeeper, missing_modules
from services.runtime.natsd import EmbeddedNats
from tests.helpers import catalog_spec
from tests.livestack import FINAL, TEST_ENV, Bus, descendants, until
from tests.upstack import UpProcess, hops_up

MISSING = missing_modules(modules())
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"the live system is incomplete: cannot run {', '.join(MISSING)}"
)
SHORT = 10_000_000  # a second or two of wall time at x600
_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def spec(job_id: str, total: int = SHORT) -> dict[str, Any]:
    return catalog_spec(job_id, total, requirements=[1, 2])


class Faults:
    """The module's ``hops up``, a NATS client of it, and the jobs accepted."""

    def __init__(self, up: UpProcess) -> None:
        self.up = up
        self.bus = Bus(up.state()["nats"]["url"], up.admin_seed)
        self.http = httpx.Client(base_url=up.gateway, timeout=10, headers=up.headers)
        self.accepted: list[str] = []

    def pids(self, module: str) -> list[int]:
        """The processes ``hops up`` runs as ``python -m <module>``."""
        return sorted(pid for pid, argv in descendants(self.up.proc.pid)
                      if argv[1:3] == ["-m", module])

    def nats_pid(self) -> int:
        found = [pid for pid, argv in descendants(self.up.proc.pid)
                 if Path(argv[0]).name == "nats-server"]
        assert len(found) == 1, found
        return found[0]

    def leader(self) -> dict[str, Any] | None:
        return self.bus.get("hops_leader", "scheduler")

    def kill(self, pid: int) -> None:
        """SIGKILL ``pid`` and return once ``hops up`` has reaped it (its
        sockets are closed by then, so NATS routes nothing more to it)."""
        os.kill(pid, signal.SIGKILL)
        until(lambda: not Path(f"/proc/{pid}").exists(), f"hops up reaped {pid}", 10,
              self.up.logs)

    def post(self, job_id: str) -> httpx.Response:
        return self.http.post("/jobs", json=spec(job_id))


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    with hops_up(tmp_path_factory.mktemp("faults"), env=TEST_ENV) as up:
        f = Faults(up)
        try:
            until(lambda: f.leader() is not None, "a leader", 30, up.logs)
            yield f
        finally:
            f.http.close()
            f.bus.close()


def listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of every TCP socket ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN and fields[9] in inodes:
                address, port = fields[1].split(":")
                found.add((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def test_nats_keeper_restarts_with_backoff_while_the_port_is_taken(tmp_path: Path) -> None:
    """nats-server is restarted on its own port only: while another process
    holds the port, each try fails and the next waits twice as long."""
    said: list[str] = []
    restarts: list[int] = []
    with EmbeddedNats(tmp_path / "nats") as nats:
        keeper = NatsKeeper(nats, said.append, lambda: restarts.append(1))
        port, first = nats.port, nats.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        until(lambda: nats.returncode is not None, "nats-server dead", 10)
        now = time.monotonic()
        keeper.tick(now)
        assert said == [f"hops up: nats-server was killed by signal 9; see {nats.log_path}; "
                        "restarting it in 1 s"]
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            keeper.tick(now + 1)
            assert said[-1].startswith("hops up: nats-server did not start again (")
            assert said[-1].endswith("restarting it in 2 s") and not restarts
        keeper.tick(now + 3)
        assert said[-1] == (f"hops up: nats-server restarted on nats://127.0.0.1:{port} "
                            "(same data dir)")
        assert nats.running and nats.pid != first and restarts == [1]


def test_every_listener_binds_loopback_only(faults: Faults) -> None:
    [monitor] = faults.pids("services.monitor")
    metrics_port = int(faults.up.metrics.rsplit(":", 1)[1].split("/")[0])
    until(lambda: any(p == metrics_port for _, p in listening(monitor)), "metrics served", 30)
    for name, pid in (("monitor", monitor), ("gateway", faults.pids("gateway")[0]),
                      ("nats-server", faults.nats_pid())):
        bound = listening(pid)
        assert bound, name
        assert {a for a, _ in bound} == {"127.0.0.1"}, (name, bound)


def test_the_standby_admits_while_the_lease_is_vacant(faults: Faults) -> None:
    lease = faults.leader()
    assert lease is not None
    holder = lease["holder"]
    replicas = faults.pids("services.scheduler")
    leader = int(holder.rsplit("-", 1)[1])  # a default replica id: <hostname>-<pid>
    assert leader in replicas
    faults.kill(leader)
    during = [f"failover-{i}" for i in range(5)]
    for job_id in during:  # no retry: a standby's admission answers at once
        r = faults.post(job_id)
        assert r.status_code == 201, (r.status_code, r.text)
    vacant = faults.leader()
    assert vacant is None or vacant["holder"] == holder, "submitted after the takeover"
    faults.accepted += during
    until(lambda: (faults.leader() or {}).get("holder") not in (None, holder),
          "a standby leads", 15, faults.up.logs)
    until(lambda: len(faults.pids("services.scheduler")) == len(replicas),
          "hops up restarted the dead replica", 15)


def test_hops_submit_retries_until_a_scheduler_answers(faults: Faults, tmp_path: Path) -> None:
    for pid in faults.pids("services.scheduler"):
        faults.kill(pid)
    assert faults.post("no-scheduler").status_code == 503  # nobody admits now
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {id: retried, model: resnet18-cifar10, batch_size: 128,\n"
                    f"     params: 11689512, total_samples: {SHORT}, requirements: [1, 2]}}\n")
    env = {"HOPS_GATEWAY_URL": faults.up.gateway, "HOPS_TOKEN": faults.up.admin_token or ""}
    result = CliRunner().invoke(app, ["submit", str(jobs)], env=env)
    assert result.exit_code == 0, (result.output, faults.up.logs())
    assert result.output.startswith("retried: accepted (attempt "), result.output
    faults.accepted.append("retried")
    assert faults.http.get("/jobs/no-scheduler").status_code == 404  # the 503 stored nothing


def test_jobs_survive_a_nats_server_kill(faults: Faults) -> None:
    """Last: every job accepted in this module is still there after nats-server
    was SIGKILLed and restarted by ``hops up``, and finishes."""
    before = [f"nats-kill-{i}" for i in range(3)]
    for job_id in before:
        r = faults.post(job_id)
        assert r.status_code == 201, r.text
    faults.accepted += before
    killed = faults.nats_pid()
    os.kill(killed, signal.SIGKILL)
    until(lambda: "nats-server restarted" in faults.up.said(), "nats-server restarted", 30,
          faults.up.logs)
    assert "nats-server was killed by signal 9" in faults.up.said()
    state = faults.up.state()
    assert state["nats"]["pid"] == faults.nats_pid() != killed
    assert state["nats"]["url"] == f"nats://127.0.0.1:{faults.up.nats_port}"  # the same port
    until(faults.bus.connected, "the test's client reconnected", 15)

    def phases() -> dict[str, str] | None:
        records = faults.bus.bucket("hops_jobs")
        now = {j: str((records.get(j) or {}).get("phase", "")) for j in faults.accepted}
        return now if all(p in FINAL for p in now.values()) else None

    ended = until(phases, "every accepted job ended", 120, faults.up.logs)
    assert set(ended.values()) == {"finished"}, ended
    for job_id in faults.accepted:
        stored = faults.bus.stored("HOPS_JOBS", f"hops.v1.jobs.events.{job_id}")
        assert [e["type"] for e in stored].count("job_submitted") == 1, job_id
