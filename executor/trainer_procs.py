"""A GPU's resident trainer processes as the pool sees them (docs/hare.md
§7, step 4): each process, its pipes and its reader thread, the tasks sent
to it (:class:`Pending`), and the errors. The pool's choices are in
:mod:`executor.trainers`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec
import torch

import hops
from executor.isolation import base_env
from hops.trainer import protocol as p
from shared.errors import CodedError


class TrainerDied(RuntimeError):
    """A trainer ended (or broke its pipe) before answering."""


class TrainerRefused(CodedError):
    """A trainer refused a command: ``code`` is one of
    :data:`hops.trainer.protocol.REFUSAL_CODES`, ``words`` its own."""


@dataclass(frozen=True)
class JobSource:
    """How a trainer makes a job's model: the script and its config."""

    script: str
    config: Mapping[str, Any]
    tenant: str = ""


@dataclass(frozen=True)
class TaskResult:
    """One gradient per micro-batch, and when the task ran: ``sent`` (the
    pool's), ``received``, ``compute_start``, ``compute_end`` (the
    trainer's), all ``time.monotonic()``; ``attempts`` 1 unless a trainer
    died under it."""

    gradients: tuple[dict[str, torch.Tensor], ...]
    trainer: int
    sent: float
    received: float
    compute_start: float
    compute_end: float
    reload_s: float
    loaded: bool  # the job's model was loaded for it
    params_sent: bool  # the round's parameters went with it
    attempts: int
    ready: float = 0.0  # the trainer's: model and parameters in place, before its turn


@dataclass(frozen=True)
class Task:
    job: str
    round: int
    lo: int
    hi: int
    sync_scale: int
    params: Mapping[str, torch.Tensor]
    upcoming: tuple[str, ...]
    turn: int  # its place in the GPU's order (hops.trainer.turns)


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    replies: queue.SimpleQueue[p.Reply | None]  # its reader thread's; None: it ended
    held: set[str] = field(default_factory=set)  # models in memory
    evicted: set[str] = field(default_factory=set)  # models moved out (state in shm)
    given: dict[str, int] = field(default_factory=dict)  # job -> round whose params it has
    pending: Pending | None = None  # its task whose replies are still to read
    # Its earlier tasks whose compute was counted and whose gradients are
    # still to read, oldest first: they come before any later reply.
    finishing: deque[Pending] = field(default_factory=deque)
    tenant: str | None = None  # whose scripts it runs (None: nobody's yet)


@dataclass(eq=False)
class Pending:
    """A task sent to its trainer: ``computed`` once its compute ended,
    ``reply`` its gradients (or its refusal) once read, ``lost`` why it
    was given up (its trainers kept dying)."""

    task: Task
    trainer: int
    proc: Proc
    sent: float
    loaded: bool
    params_sent: bool
    attempts: int
    computed: p.Computed | None = None
    reply: p.Ran | p.Refused | None = None
    lost: str | None = None

    def adopt(self, again: Pending) -> None:
        """Become ``again``, this task sent anew to a fresh trainer."""
        self.trainer, self.proc, self.sent = again.trainer, again.proc, again.sent
        self.loaded, self.params_sent, self.attempts = again.loaded, again.params_sent, \
            again.attempts
        self.computed, self.reply = None, None
        self.proc.pending = self



def spawn(device: str, cores: tuple[int, ...], threads: int, turns: list[str],
          fds: tuple[int, ...], stderr: IO[bytes] | int | None,
          deterministic: bool = False) -> Proc:
    """A trainer process, up (its ``ready`` read): on ``device``, pinned
    to ``cores`` (none: not pinned), with ``threads`` (0: its default),
    given the GPU's ``turns`` options and their descriptors ``fds``;
    ``deterministic``: torch's deterministic algorithms only."""
    argv = [sys.executable, "-m", "hops.trainer.resident", "--device", device]
    if deterministic:
        argv.append("--deterministic")
    if cores:
        argv += ["--cores", ",".join(map(str, cores))]
    if threads:
        argv += ["--threads", str(threads)]
    popen = subprocess.Popen(argv + turns, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=stderr, env=_child_env(), pass_fds=fds)
    proc = Proc(popen, queue.SimpleQueue())
    assert popen.stdout is not None
    threading.Thread(target=_reader, args=(popen.stdout, proc.replies), daemon=True,
                     name=f"trainer-{popen.pid}").start()
    ready = read(proc)
    if not isinstance(ready, p.Ready):
        raise TrainerDied(f"trainer {popen.pid} said {ready!r} instead of ready")
    return proc


def ask(proc: Proc, command: p.Command) -> p.Reply:
    """``command``'s reply (``proc`` has no task's replies to come)."""
    send(proc, command)
    reply = read(proc)
    if isinstance(reply, p.Refused):
        raise TrainerRefused(reply.code, reply.words)
    return reply

def send(proc: Proc, command: p.Command) -> None:
    """Write ``command`` to ``proc`` (TrainerDied when its pipe is broken)."""
    try:
        assert proc.popen.stdin is not None
        proc.popen.stdin.write(p.frame(command))
        proc.popen.stdin.flush()
    except (BrokenPipeError, ConnectionResetError, ValueError) as e:
        raise TrainerDied(f"trainer {proc.popen.pid}: {e}") from None


def read(proc: Proc) -> p.Reply:
    """``proc``'s next reply (TrainerDied once it ended)."""
    reply = proc.replies.get()
    if reply is None:
        proc.replies.put(None)  # for whoever reads next
        code = proc.popen.wait()
        raise TrainerDied(f"trainer {proc.popen.pid} ended (exit status {code})")
    return reply


def _reader(stdout: IO[bytes], replies: queue.SimpleQueue[p.Reply | None]) -> None:
    """A trainer's replies, decoded as they come (a run's gradients while
    the GPU's next task computes); None once it ends or breaks its pipe."""
    with contextlib.suppress(ValueError, OSError, msgspec.DecodeError, msgspec.ValidationError):
        while (body := p.read_frame(stdout)) is not None:
            replies.put(p.decode_reply(body))
    replies.put(None)


def _child_env() -> dict[str, str]:
    """The environment of a trainer: what a job inherits of this one (no
    system settings or credentials, :func:`executor.isolation.passes`),
    with the folder this process's ``hops`` comes from first on the path,
    so that the trainer runs the same code as its pool."""
    root = str(Path(hops.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    env = base_env(os.environ, tempfile.gettempdir())
    return {**env, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def close_pipes(popen: subprocess.Popen[bytes]) -> None:
    for pipe in (popen.stdin, popen.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # a dead trainer's unsent bytes
                pipe.close()
