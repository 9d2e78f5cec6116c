"""The process supervisor of ``hops up`` (:func:`cli.up.up.up`) and of the tests'
stacks (``tests/livestack.py``): starts each process of :mod:`cli.up.stack` in a
process group of its own, restarts what dies with the backoff of
:func:`cli.up.stack.restart_delay` (as compose's ``restart: unless-stopped``),
and stops everything in :func:`cli.up.stack.stop_order`: SIGTERM, a grace
period, then SIGKILL to whatever is left of each process group. On Linux it
can be a child subreaper (:func:`become_subreaper`), so that descendants
orphaned by a dead parent are reaped here rather than left as zombies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cli.up.stack import (
    Component,
    StackConfig,
    describe_exit,
    environment,
    restart_delay,
    stop_order,
)

Say = Callable[[str], None]
# The folder holding cli/ and its sibling packages (gateway/, executor/,
# services/...): a source checkout, or site-packages once installed.
SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_REAP_WAIT_S = 5.0


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


_GIVEN: set[int] = set()  # ports free_port has returned in this process


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago, for a process that
    must be told its port before it starts. Another process may take it in
    between; where a server can pick its own port (nats-server's ``-p -1``),
    let it. The kernel may hand a just-closed port out again, so a port this
    process already gave is never given twice (two services told the same
    health port: one fails to bind)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now. Bound as the servers
    bind (uvicorn and nats-server set SO_REUSEADDR), so connections of a
    just-stopped stack left in TIME_WAIT do not count as in use (a restart
    right after Ctrl-C), while a live listener still does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
        # What else to watch on every tick (``hops up``: nats-server).
        self.on_tick: Callable[[float], None] = lambda _now: None
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
        if not self.stopping.is_set():
            self.on_tick(now)
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
