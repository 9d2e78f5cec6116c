"""A real ``hops up`` for tests: the command as a subprocess (nats-server,
every service, the gateway and an EMULATED cluster), its output in a file,
its state in ``<data>/up.json``. :func:`hops_up` starts it on free ports and
returns once it says it is up; leaving the ``with`` stops it with SIGINT.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import free_port
from tests.livestack import until

ROOT = Path(__file__).resolve().parent.parent
HOPS = [sys.executable, "-c", "from cli.main import app; app(prog_name='hops')"]
# Two servers of one GPU type, so that a job is profiled on one server (§3.2).
CLUSTER = """\
name: two-servers
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4, model: other}
"""


@dataclass
class UpProcess:
    """One running ``hops up`` and where it serves."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    gateway: str
    metrics: str
    nats_port: int
    gateway_port: int
    out: Path

    @property
    def admin_token(self) -> str | None:
        """The admin's bearer token (None when started with --no-auth)."""
        path = self.data_dir / "credentials" / "admin.token"
        return path.read_text().strip() if path.exists() else None

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers of the admin's requests to the gateway."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    @property
    def admin_seed(self) -> Path | None:
        """The admin's NATS credential (None when started with --no-auth)."""
        seed = self.data_dir / "credentials" / "admin.nk"
        return seed if seed.exists() else None

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((self.data_dir / "up.json").read_text())
        return state

    def said(self) -> str:
        return self.out.read_text(errors="replace")

    def logs(self) -> str:
        parts = [self.said()]
        for log in sorted((self.data_dir / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:])
        return "\n".join(parts)


@contextlib.contextmanager
def hops_up(base: Path, *args: str, env: Mapping[str, str] | None = None,
            timeout: float = 90.0,
            ports: tuple[int, int, int] | None = None) -> Iterator[UpProcess]:
    """``hops up`` on free ports with the cluster :data:`CLUSTER`, 600 times
    faster than real time and rounds of 2 s, ``args`` added; ``env`` on top
    of this process's environment (every process of the stack inherits it).
    ``ports`` (NATS, gateway, metrics) instead of free ones: a restart on the
    ports of a stack just stopped."""
    cluster = base / "cluster.yaml"
    cluster.write_text(CLUSTER)
    nats_port, gateway_port, metrics_port = ports or (free_port(), free_port(), free_port())
    argv = ["up", "--cluster", str(cluster), "--time-scale", "600", "--round-s", "2",
            "--data-dir", str(base / "data"), "--nats-port", str(nats_port),
            "--gateway-port", str(gateway_port), "--metrics-port", str(metrics_port), *args]
    out = base / "stdout.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen([*HOPS, *argv], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    up = UpProcess(proc, base / "data", f"http://127.0.0.1:{gateway_port}",
                   f"http://127.0.0.1:{metrics_port}/metrics", nats_port, gateway_port, out)
    try:
        until(lambda: "Hops is up" in up.said() or proc.poll() is not None, "hops up", timeout)
        assert proc.poll() is None, up.logs()
        yield up
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
