"""compose.yaml brought up on a real Docker engine, for
tests/test_compose_live.py (docs/compose.md).

:func:`build_standins` runs deploy/images/build-standins.sh, which makes the
public base images that the Dockerfile and compose.yaml name from Debian's
packages (kept when their tags exist). :class:`Deployment` runs
``docker-compose`` (v1) on a copy of compose.yaml that differs from it in
three things only, so that runs beside each other and beside a user's own
deployment do not collide: its published ports are free ports of the host's
loopback, its Hops image is ``hops:compose-test-<checkout>`` (:data:`IMAGE`)
and the build context is this tree. Its secrets are made by ``hops credentials --compose``, as
compose.yaml's comment says.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import nats
import yaml

from cli.up.launcher import free_port
from services.runtime.natsd import nats_server_binary
from tests.engines_docker import DockerEngine
from tests.livestack import until

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "deploy" / "images" / "build-standins.sh"
# One tag per checkout: runs from two checkouts on one engine at once do not
# build over each other's image (an `up` after `down` starts the tag's image
# as it is then), and runs from the same checkout reuse it.
IMAGE = f"hops:compose-test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
HEALTHY_TIMEOUT_S = 180.0


def build_standins(engine: DockerEngine) -> float:
    """Build the stand-in base images unless they exist; the seconds it took."""
    env = {**os.environ, "NATS_SERVER": nats_server_binary(), "DOCKER": str(engine.docker)}
    t0 = time.monotonic()
    subprocess.run([str(STANDINS)], env=env, check=True, timeout=900)
    return time.monotonic() - t0


def derived_compose(published: dict[int, int]) -> dict[str, Any]:
    """compose.yaml with the test's ports, image name and build context
    (the module docstring); ``published`` maps a container port to the
    host's."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for service in doc["services"].values():
        if "build" in service:
            service["build"] = str(ROOT)
            service["image"] = IMAGE
        ports = []
        for mapping in service.get("ports", []):
            host, _, inner = str(mapping).rpartition(":")
            address = host.rpartition(":")[0]
            ports.append(f"{address}:{published.setdefault(int(inner), free_port())}:{inner}")
        if ports:
            service["ports"] = ports
    return doc


class Deployment:
    """One compose project in ``work``: its own name, secrets and ports."""

    def __init__(self, engine: DockerEngine, work: Path) -> None:
        self.engine = engine
        self.work = work
        self.project = f"hopstest{uuid.uuid4().hex[:8]}"
        self.ports: dict[int, int] = {}
        self.doc = derived_compose(self.ports)
        (work / "compose.yaml").write_text(yaml.safe_dump(self.doc, sort_keys=False))
        subprocess.run([sys.executable, "-m", "cli.main", "credentials", "--out",
                        str(work / "secrets"), "--compose"], cwd=ROOT, check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
        self.token = (work / "secrets" / "admin.token").read_text().strip()

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[8080]}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.ports[4222]}"

    def compose(self, *args: str, timeout: float = 900) -> str:
        assert self.engine.compose is not None
        done = subprocess.run([self.engine.compose, "-p", self.project, "-f",
                               str(self.work / "compose.yaml"), *args], cwd=self.work,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: {done.returncode}\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def docker(self, *args: str) -> str:
        done = subprocess.run([str(self.engine.docker), *args], capture_output=True, text=True,
                              timeout=120, check=False)
        if done.returncode != 0:  # with the engine's answer, which says why
            raise AssertionError(f"docker {' '.join(args)}: {done.returncode}\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def services(self) -> list[str]:
        """The services a plain ``up`` starts: those in no profile."""
        return [name for name, svc in self.doc["services"].items() if not svc.get("profiles")]

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).split()

    def health(self, container: str) -> str:
        """``healthy`` etc., or the state of a container without a check."""
        return self.docker("inspect", "--format", "{{if .State.Health}}{{.State.Health.Status}}"
                           "{{else}}{{.State.Status}}{{end}}", container).strip()

    def unhealthy(self, counts: dict[str, int]) -> dict[str, list[str]]:
        """Per service, the health of its containers where not as wanted:
        ``counts[service]`` containers, every one healthy."""
        wrong = {}
        for service in self.services():
            states = [self.health(c) for c in self.containers(service)]
            if len(states) != counts.get(service, 1) or set(states) != {"healthy"}:
                wrong[service] = states
        return wrong

    def wait_healthy(self, counts: dict[str, int] | None = None) -> None:
        until(lambda: not self.unhealthy(counts or {}), "every service healthy",
              HEALTHY_TIMEOUT_S, lambda: f"{self.unhealthy(counts or {})}\n{self.logs()}")

    def logs(self, service: str = "") -> str:
        return self.compose("logs", "--no-color", "--tail", "40", *([service] if service else []))

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.gateway_url, timeout=15,
                            headers={"Authorization": f"Bearer {self.token}"})

    def leader(self) -> str | None:
        """The scheduler container that leads: the last to log its election
        (a replica that stepped down logs that too)."""
        latest: tuple[str, str] | None = None
        for container in self.containers("scheduler"):
            for line in self._stamped_logs(container):
                stamp, text = _sortable(line.partition(" ")[0]), line.partition(" ")[2]
                if "elected leader" in text and (latest is None or stamp > latest[0]):
                    latest = (stamp, container)
                elif ("no longer leader" in text or "leadership released" in text) and \
                        latest is not None and latest[1] == container and stamp > latest[0]:
                    latest = None
        return latest[1] if latest else None

    def _stamped_logs(self, container: str) -> list[str]:
        done = subprocess.run([str(self.engine.docker), "logs", "--timestamps", container],
                              capture_output=True, text=True, timeout=60, check=False)
        return (done.stdout + done.stderr).splitlines()

    def request(self, subject: str, body: bytes) -> bytes:
        """One NATS request as the admin (its seed from the secrets), from the host."""
        async def ask() -> bytes:
            seed = str(self.work / "secrets" / "admin.nk")
            nc = await nats.connect(self.nats_url, nkeys_seed=seed, connect_timeout=5,
                                    max_reconnect_attempts=0)
            try:
                return bytes((await nc.request(subject, body, timeout=10)).data)
            finally:
                await nc.close()

        return asyncio.run(ask())


def _sortable(stamp: str) -> str:
    """Docker's RFC 3339 time with its fraction padded to 9 digits (docker
    drops trailing zeros, which would misorder the strings)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return f"{whole}.{fraction.ljust(9, '0')}"
