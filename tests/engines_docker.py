"""The engines of the engine tests (issue 36): each test names what it needs
with :func:`require`, which skips with a plain reason when the engine is
absent, and fails instead when ``CI=true`` (CI installs every engine, so
there a missing one is a broken set-up, not a machine without it).

:class:`DockerEngine` is Debian's Docker engine (``docker.io``, 20.10) and
Compose v1 (``docker-compose``, 1.29): it uses a running engine, or starts
``dockerd`` itself when it may (as root) and stops only the one it started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

from tests.engines import require

# Debian's CLI first: another `docker` earlier on the PATH may be a newer
# client than the engine it talks to.
DEBIAN_DOCKER = "/usr/bin/docker"
START_TIMEOUT_S = 30.0


def docker_cli() -> str | None:
    if os.access(DEBIAN_DOCKER, os.X_OK):
        return DEBIAN_DOCKER
    return shutil.which("docker")


def engine_answers(docker: str) -> bool:
    """Whether the engine behind ``docker`` answers (``docker info``)."""
    probe = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=20, check=False)
    return probe.returncode == 0 and bool(probe.stdout.strip())


class DockerEngine:
    """A Docker engine to run compose on, for the length of a ``with`` block:
    the running one, else a ``dockerd`` started here (cgroupfs: the driver
    that works where systemd does not run) and stopped at the end."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.docker = docker_cli()
        self.compose = shutil.which("docker-compose")
        self.proc: subprocess.Popen[bytes] | None = None

    def missing(self) -> str:
        """Why this engine cannot run here ('' when it can)."""
        if self.docker is None or shutil.which("dockerd") is None:
            return "no Docker engine (apt-get install docker.io)"
        if self.compose is None:
            return "no docker-compose (apt-get install docker-compose)"
        if shutil.which("debootstrap") is None:
            return "no debootstrap, which builds the stand-in images (apt-get install debootstrap)"
        if os.geteuid() != 0:
            return "not root: dockerd and debootstrap need root"
        return ""

    def __enter__(self) -> DockerEngine:
        require("Docker", not self.missing(), self.missing())
        assert self.docker is not None
        if engine_answers(self.docker):
            return self
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["dockerd", "--exec-opt", "native.cgroupdriver=cgroupfs"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not engine_answers(self.docker):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"dockerd did not start within {START_TIMEOUT_S:g} s:\n{tail}")
            time.sleep(0.2)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
