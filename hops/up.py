"""``hops up``: the whole live system on this machine, one process per component.

It starts nats-server with JetStream (:class:`~services.runtime.natsd.EmbeddedNats`,
state under ``<data-dir>/nats``), then every component of :mod:`hops.stack`
as its own process with its log in ``<data-dir>/logs/<name>.log``, waits
until the gateway's ``/healthz`` answers, says where the gateway and the
metrics are, and supervises: a process that ends without being asked to is
reported (with its log file). SIGINT (Ctrl-C) or SIGTERM stops everything:
SIGTERM to each process, a grace period, then SIGKILL to whatever is left of
each one's process group (emulated jobs included), and nats-server last.
On Linux ``hops up`` is a child subreaper: descendants orphaned by a dead
parent become its children, are reaped, and it returns only once every
group it killed is gone.
Real executors (``--executor real``) stop their jobs themselves on SIGTERM:
a real job runs in a process group of its own, so that it can outlive a
crash of its executor.
``<data-dir>/up.json`` lists the processes while the stack runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import IO

import httpx

from hops.stack import (
    Component,
    StackConfig,
    components,
    describe_exit,
    environment,
    modules,
    restart_delay,
    stop_order,
)
from services.runtime.natsd import EmbeddedNats, NatsServerError

Say = Callable[[str], None]
# The folder holding hops/ and its sibling packages (gateway/, executor/,
# services/...): a source checkout, or site-packages once installed.
SOURCE_ROOT = str(Path(__file__).resolve().parents[1])
_POLL_S = 0.1
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_REAP_WAIT_S = 5.0


class UpError(RuntimeError):
    """The stack cannot start; the message says why."""


@dataclass
class Child:
    """One component's process, and its restarts."""

    component: Component
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    groups: list[int] = field(default_factory=list)  # every process group it had
    delay: float | None = None  # the last restart delay
    restart_at: float | None = None  # set while a restart is due


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago, for a process that
    must be told its port before it starts. Another process may take it in
    between; where a server can pick its own port (nats-server's ``-p -1``),
    let it."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
    return port


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:
    """In the child before exec (Linux): get SIGTERM if ``hops up`` dies, so a
    killed launcher leaves no orphan services behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def become_subreaper() -> bool:
    """Linux: adopt our orphaned descendants (an emulated job whose executor
    died first), so that we can reap them. Otherwise they are left to PID 1,
    which in a container may never reap them, and a SIGKILLed group then
    lingers as zombies. Whether it worked."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def reap_orphans(tracked: set[int]) -> int:
    """Reap every exited child that is not one of ``tracked`` (those are
    ``Popen``'s to wait for); peeking first leaves theirs alone. How many."""
    reaped = 0
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid in tracked:
            return reaped
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
        reaped += 1


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Launcher:
    """Starts, supervises (restarting what dies, as compose's ``restart:
    unless-stopped`` would) and stops the processes of one stack."""

    def __init__(self, config: StackConfig, say: Say, grace: float = 15.0) -> None:
        self.config = config
        self.say = say
        self.grace = grace
        self.children: list[Child] = []
        self.stopping = threading.Event()
        self.on_restart: Callable[[], None] = lambda: None
        self.reaper = False  # set once we adopt orphans (become_subreaper)

    def _spawn(self, comp: Component) -> subprocess.Popen[bytes]:
        log_path = comp.log_file(self.config)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = environment(self.config, comp, os.environ, SOURCE_ROOT)
        with log_path.open("ab") as log:
            return subprocess.Popen(
                comp.argv(sys.executable),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # our own stop order, not the terminal's Ctrl-C
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def start(self, comp: Component) -> Child:
        proc = self._spawn(comp)
        child = Child(comp, proc, comp.log_file(self.config), time.monotonic(), [proc.pid])
        self.children.append(child)
        return child

    def tick(self, now: float) -> list[Child]:
        """Say which children died since the last tick and schedule their
        restart; restart those that are due. Returns the newly dead."""
        died = []
        for c in self.children:
            if c.restart_at is None and c.proc.poll() is not None:
                died.append(c)
                c.delay = restart_delay(c.delay, now - c.started)
                c.restart_at = now + c.delay
                note = describe_exit(c.component.name, c.proc.returncode, c.log)
                self.say(f"{note}; restarting it in {c.delay:g} s")
            elif c.restart_at is not None and now >= c.restart_at and not self.stopping.is_set():
                _kill_group(c.proc.pid)  # what the dead one left behind
                c.proc = self._spawn(c.component)
                c.groups.append(c.proc.pid)
                c.started, c.restart_at = now, None
                self.on_restart()
        if self.reaper:
            reap_orphans({c.proc.pid for c in self.children})
        return died

    def stop(self) -> None:
        """SIGTERM everyone (gateway first), wait, SIGKILL what is left,
        including grandchildren in each process group; say which did not
        stop cleanly."""
        order = {name: i for i, name in enumerate(stop_order(self.config))}
        running = [c for c in self.children if c.proc.poll() is None]
        for c in sorted(running, key=lambda c: order.get(c.component.name, -1)):
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for c in running:
            name = c.component.name
            try:
                code = c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"hops up: {name} did not stop in {self.grace:g} s; killing it")
                continue
            if code != 0:
                self.say(f"hops up: {name} exited with {code} while stopping; see {c.log}")
        for c in self.children:
            for pgid in c.groups:
                _kill_group(pgid)  # a group outlives its leader
            c.proc.wait()
        if self.reaper:
            self._await_groups([g for c in self.children for g in c.groups])

    def _await_groups(self, groups: list[int]) -> None:
        """SIGKILL takes effect asynchronously: return once every group is
        gone (its orphans reaped), so that nothing outlives ``hops up``."""
        deadline = time.monotonic() + _REAP_WAIT_S
        while True:
            reap_orphans(set())
            left = [g for g in groups if _group_alive(g)]
            if not left:
                return
            if time.monotonic() >= deadline:
                self.say(f"hops up: process groups {left} are still there after SIGKILL")
                return
            time.sleep(0.02)


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url}/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(launcher: Launcher, gateway: Child, timeout: float) -> None:
    """Until the gateway answers ``/healthz``; UpError if it dies or takes
    longer than ``timeout``; returns early (quietly) on a stop request."""
    deadline = time.monotonic() + timeout
    see = f"see {gateway.log}"
    with httpx.Client(timeout=1.0) as client:
        while not launcher.stopping.is_set():
            if _healthy(client, launcher.config.gateway_url):
                return
            if gateway.proc.poll() is not None:
                raise UpError(f"the gateway exited with {gateway.proc.returncode}; {see}")
            if time.monotonic() > deadline:
                raise UpError(f"the gateway did not become healthy in {timeout:g} s; {see}")
            launcher.tick(time.monotonic())
            launcher.stopping.wait(_POLL_S)


def _check_ports(config: StackConfig, nats_port: int) -> None:
    wanted = [("gateway", config.gateway_port), ("metrics", config.metrics_port)]
    if nats_port:
        wanted.append(("NATS", nats_port))
    for name, port in wanted:
        if not port_free(port):
            flag = {"NATS": "--nats-port"}.get(name, f"--{name}-port")
            raise UpError(f"port {port} ({name}) is in use; choose another with {flag}")


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that ``python -m`` cannot run from :data:`SOURCE_ROOT`."""
    if SOURCE_ROOT not in sys.path:
        sys.path.append(SOURCE_ROOT)  # as the children will have it on PYTHONPATH
    missing = []
    for name in names:
        try:
            runnable = importlib.util.find_spec(f"{name}.__main__") is not None
        except ImportError:
            runnable = False
        if not runnable and not _is_plain_module(name):
            missing.append(name)
    return missing


def _is_plain_module(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return False
    return spec is not None and spec.submodule_search_locations is None


def _write_state(config: StackConfig, nats: EmbeddedNats, children: list[Child]) -> None:
    state = {
        "pid": os.getpid(),
        "gateway": config.gateway_url,
        "metrics": config.metrics_url,
        "nats": {"url": nats.url, "log": str(nats.log_path)},
        "components": {
            c.component.name: {"pid": c.proc.pid, "argv": c.proc.args, "log": str(c.log)}
            for c in children
        },
    }
    config.state_file.write_text(json.dumps(state, indent=2) + "\n")


def _executors(config: StackConfig) -> str:
    if config.executor == "real":
        return f"real executors, job files in {config.runs_dir}/"
    return f"emulated, time x{config.time_scale:g}"


def banner(config: StackConfig, nats_url: str) -> str:
    return "\n".join(
        [
            f"Hops is up: cluster {config.cluster} ({_executors(config)}), "
            f"rounds of {config.round_s:g} s",
            f"  gateway  {config.gateway_url}   (API docs {config.gateway_url}/docs)",
            f"  metrics  {config.metrics_url}",
            f"  NATS     {nats_url}",
            f"  logs     {config.logs_dir}/",
            "Ctrl-C stops everything.",
        ]
    )


def _install_signals(stopping: threading.Event) -> Callable[[], None]:
    def handler(_sig: int, _frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def up(
    config: StackConfig,
    nats_port: int,
    say: Say,
    health_timeout: float = 90.0,
) -> int:
    """Run the stack until SIGINT/SIGTERM; the exit code (0 after a requested
    stop, 1 when it could not start). See the module docstring."""
    nats = EmbeddedNats(config.nats_dir, port=nats_port)
    launcher = Launcher(config, say)
    launcher.reaper = become_subreaper()
    restore = _install_signals(launcher.stopping)
    try:
        _check_ports(config, nats_port)
        missing = missing_modules(modules())
        if missing:
            raise UpError(f"cannot run {', '.join(missing)}: not found from {SOURCE_ROOT}")
        config.data_dir.mkdir(parents=True, exist_ok=True)
        nats.start()
        launcher.config = config = replace(config, nats_url=nats.url)
        started = [launcher.start(comp) for comp in components(config)]
        _write_state(config, nats, started)
        launcher.on_restart = lambda: _write_state(config, nats, launcher.children)
        wait_healthy(launcher, started[-1], health_timeout)
        if not launcher.stopping.is_set():
            say(banner(config, nats.url))
        _supervise(launcher, nats)
        return 0
    except (UpError, NatsServerError, OSError) as e:
        say(f"hops up: {e}")
        return 1
    finally:
        if launcher.children:
            say("hops up: stopping")
        launcher.stop()
        nats.stop()
        config.state_file.unlink(missing_ok=True)
        restore()


def _supervise(launcher: Launcher, nats: EmbeddedNats) -> None:
    nats_reported = False
    while not launcher.stopping.wait(_POLL_S * 5):
        launcher.tick(time.monotonic())
        if not nats.running and not nats_reported:
            nats_reported = True
            launcher.say(f"hops up: nats-server has stopped; see {nats.log_path}")


def stdout_say(out: IO[str] | None = None) -> Say:
    stream = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    return say
