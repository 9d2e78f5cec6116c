"""compose.yaml brought up on a real Docker engine, for
tests/test_compose_live.py (docs/compose.md).

:func:`build_standins` runs deploy/images/build-standins.sh, which makes the
public base images that the Dockerfile and compose.yaml name from Debian's
packages (kept when their tags exist). :class:`Deployment` runs
``docker-compose`` (v1) on a copy of compose.yaml that differs from it in
three things only, so that runs beside each other and beside a user's own
deployment do not collide: its published ports are free ports of the host's
loopback, its Hops image is ``hops:compose-test-<checkout>`` (:data:`IMAGE`)
and the build context is this tree. Its secrets are made by ``hops credentials
--compose``, as compose.yaml's comment says. An ``env_file`` (``docker-compose
--env-file``, e.g. deploy/nats-cluster.env) sets compose.yaml's variables and
its profiles (``COMPOSE_PROFILES``); ``overrides`` are more Compose files
after compose.yaml (``-f``), such as deploy/compose.slurm.yaml made to build
from this tree (:func:`slurm_override`), with their variables in
:attr:`Deployment.env`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import nats
import yaml

from cli.up.launcher import free_port
from services.runtime.natsd import nats_server_binary
from tests.engines_docker import DockerEngine
from tests.helpers import catalog_spec
from tests.livestack import FINAL, until

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "deploy" / "images" / "build-standins.sh"
# One tag per checkout: runs from two checkouts on one engine at once do not
# build over each other's image (an `up` after `down` starts the tag's image
# as it is then), and runs from the same checkout reuse it.
IMAGE = f"hops:compose-test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
# The Slurm bridge's image (Dockerfile.slurm, FROM the image above), tagged alike.
SLURM_IMAGE = IMAGE.replace("hops:", "hops-slurm:", 1)
HEALTHY_TIMEOUT_S = 180.0
SHORT = 3_000_000  # samples: seconds of wall time at the cluster's 60x


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


def slurm_override() -> dict[str, Any]:
    """deploy/compose.slurm.yaml with the test's image names and build
    context: the bridge's image starts FROM :data:`IMAGE`."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "compose.slurm.yaml").read_text())
    bridge = doc["services"]["cluster"]
    bridge["image"] = SLURM_IMAGE
    bridge["build"] = {**bridge["build"], "context": str(ROOT), "args": {"HOPS_IMAGE": IMAGE}}
    return doc


class Deployment:
    """One compose project in ``work``: its own name, secrets and ports."""

    def __init__(self, engine: DockerEngine, work: Path, env_file: Path | None = None,
                 overrides: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.engine = engine
        self.work = work
        self.env_file = env_file
        self.profiles = set(read_env_file(env_file).get("COMPOSE_PROFILES", "").split(",")) - {""}
        self.project = f"hopstest{uuid.uuid4().hex[:8]}"
        self.ports: dict[int, int] = {}
        self.doc = derived_compose(self.ports)
        # variables of the Compose files, for every docker-compose command
        self.env: dict[str, str] = {}
        self.files = [work / "compose.yaml"]
        self.files[0].write_text(yaml.safe_dump(self.doc, sort_keys=False))
        for name, doc in (overrides or {}).items():
            self.files.append(work / name)
            self.files[-1].write_text(yaml.safe_dump(doc, sort_keys=False))
        self.credentials()
        self.token = (work / "secrets" / "admin.token").read_text().strip()

    def credentials(self, cluster: str = "") -> None:
        """``hops credentials --compose`` into the project's secrets, for
        ``cluster``'s executors too (kept: what exists stays)."""
        more = ["--cluster", cluster] if cluster else []
        subprocess.run([sys.executable, "-m", "cli.main", "credentials", "--out",
                        str(self.work / "secrets"), "--compose", *more], cwd=ROOT, check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[8080]}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.ports[4222]}"

    def compose(self, *args: str, timeout: float = 900) -> str:
        assert self.engine.compose is not None
        env_file = ["--env-file", str(self.env_file)] if self.env_file else []
        files = [arg for path in self.files for arg in ("-f", str(path))]
        done = subprocess.run([self.engine.compose, *env_file, "-p", self.project, *files, *args],
                              cwd=self.work, env={**os.environ, **self.env},
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
        """The services ``up`` starts: those in no profile or an enabled one."""
        return [name for name, svc in self.doc["services"].items()
                if not svc.get("profiles") or self.profiles & set(svc["profiles"])]

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

    def jsz(self, container: str) -> dict[str, Any]:
        """A nats container's JetStream monitoring page (``/jsz``), every
        account's streams with their configuration, read inside it."""
        page = self.docker("exec", container, "wget", "-qO-",
                           "http://127.0.0.1:8222/jsz?accounts=true&streams=true&config=true")
        body: dict[str, Any] = json.loads(page)
        return body

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


@contextmanager
def deployed(work: Path, counts: dict[str, int], env_file: Path | None = None,
             overrides: Mapping[str, dict[str, Any]] | None = None,
             prepare: Callable[[Deployment], None] | None = None) -> Iterator[Deployment]:
    """compose.yaml (and ``overrides``) up (``--build``) on a Docker engine,
    from the stand-ins, until every service is healthy (``counts``
    containers of a service where not one); ``prepare`` runs before the
    ``up``; ``down -v`` at the end, whatever happened."""
    with DockerEngine(work / "dockerd.log") as engine:
        t0 = time.monotonic()
        built = build_standins(engine)
        d = Deployment(engine, work, env_file, overrides)
        try:
            if prepare is not None:
                prepare(d)
            d.compose("up", "-d", "--build")
            d.wait_healthy(counts)
            print(f"\ncompose: stand-ins {built:.0f} s, up healthy after "
                  f"{time.monotonic() - t0:.0f} s")
            yield d
        finally:
            d.compose("down", "-v", "--remove-orphans")


# --- jobs through the gateway ------------------------------------------------------


def submit(d: Deployment, job_id: str, total: int = SHORT) -> None:
    """Submit a catalog job through the gateway; it must be accepted (201)."""
    with d.http() as api:
        r = api.post("/jobs", json=catalog_spec(job_id, total, requirements=[1, 2]))
    assert r.status_code == 201, r.text


def try_submit(d: Deployment, job_id: str, total: int = SHORT) -> bool:
    """Submit once; whether the job is stored: accepted now (201), or by an
    earlier attempt whose answer was lost (409 to the very id)."""
    try:
        with d.http() as api:
            r = api.post("/jobs", json=catalog_spec(job_id, total, requirements=[1, 2]))
    except httpx.HTTPError:  # the gateway unreachable or too slow: ask again
        return False
    return r.status_code in (201, 409)  # else no replica answered in time (503)


def record(d: Deployment, job_id: str) -> dict[str, Any]:
    """The job's record from the gateway."""
    with d.http() as api:
        r = api.get(f"/jobs/{job_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def wait_finished(d: Deployment, job_ids: list[str], timeout: float = 180) -> None:
    """Wait until every job is in a final phase; each must be ``finished``."""
    def final() -> dict[str, str] | None:
        try:
            phases = {j: record(d, j)["phase"] for j in job_ids}
        except Exception:  # the gateway restarting or failing over: ask again
            return None
        return phases if set(phases.values()) <= set(FINAL) else None

    def detail() -> str:
        with d.http() as api:
            records = {j: api.get(f"/jobs/{j}").text for j in job_ids}
        return f"{records}\n{d.logs()}"

    phases = until(final, f"{job_ids} final", timeout, detail)
    assert set(phases.values()) == {"finished"}, (phases, d.logs())


def read_env_file(path: Path | None) -> dict[str, str]:
    """``KEY=VALUE`` lines of a compose env file (none: empty)."""
    if path is None:
        return {}
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def _sortable(stamp: str) -> str:
    """Docker's RFC 3339 time with its fraction padded to 9 digits (docker
    drops trailing zeros, which would misorder the strings)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return f"{whole}.{fraction.ljust(9, '0')}"
