"""A GPU's pool of resident trainer processes (docs/hare.md §7, step 4;
Hare §4, fast task switching).

``HOPS_TRAINERS_PER_GPU`` processes of :mod:`hops.trainer.resident` per
GPU (:class:`executor.settings.ExecutorSettings`, 2 by default), started
when the pool is made, ahead of any task, and pinned to the GPU's CPU
cores when the executor has some for it. A task runs on the process that
holds its job's model; otherwise the choice rule (:mod:`executor.
trainer_choice`) names the process that loads it and the models that
process moves out first (to shared memory).

**Parameters once per round and trainer.** A round's parameters come with
each task (the caller has them: the job's aggregator's, Hare's parameter
server); the pool sends them to a process the first time it runs that job's
round there, and not again for the same round. A process records nothing
as a round until it was given that round's parameters: a freshly loaded
model holds the script's seeded weights, which are no round's, so round
0's parameters are sent to it like any other.

**A trainer that dies** (SIGKILL mid-task, say) is replaced by a new
process on the same cores, and the task runs again there from the same
parameters: its gradients come back once.

**One tenant per process.** A trainer runs the jobs of the tenant of its
first job until it is reset; a job of another tenant goes to a trainer
that is free or that tenant's, and when there is none, a trainer is
replaced by a fresh process for it (:func:`executor.trainer_choice.place`). A refusal is raised
(:class:`TrainerRefused`, with the trainer's code), never retried.

**The next task starts while the gradients travel.** :meth:`TrainerPool.
start` returns as soon as a task's compute ended (the trainer says so
before it sends the gradients); :meth:`TrainerPool.finish` returns the
gradients, which a reader thread per trainer takes off its pipe meanwhile;
:meth:`TrainerPool.run` is both.

Blocking calls: an asyncio shell runs them in a thread (the real
executor's task work, :mod:`executor.realwork`, one pool per GPU).
"""

from __future__ import annotations

import contextlib
import glob
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import msgspec
import torch

import hops
from executor.isolation import base_env
from executor.settings import ExecutorSettings
from executor.trainer_choice import place
from hops.trainer import protocol as p
from hops.trainer.params import evict_folder
from hops.trainer.wire import decode_tensors, encode_tensors
from shared.errors import CodedError

DEFAULT_TRAINERS: Final = ExecutorSettings.trainers_per_gpu
RETRIES: Final = 2  # reruns of a task whose trainer died


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


@dataclass(frozen=True)
class _Task:
    job: str
    round: int
    lo: int
    hi: int
    sync_scale: int
    params: Mapping[str, torch.Tensor]
    upcoming: tuple[str, ...]


@dataclass
class _Proc:
    popen: subprocess.Popen[bytes]
    replies: queue.SimpleQueue[p.Reply | None]  # its reader thread's; None: it ended
    held: set[str] = field(default_factory=set)  # models in memory
    evicted: set[str] = field(default_factory=set)  # models moved out (state in shm)
    given: dict[str, int] = field(default_factory=dict)  # job -> round whose params it has
    pending: Pending | None = None  # its task whose gradients are still to read
    tenant: str | None = None  # whose scripts it runs (None: nobody's yet)


@dataclass
class Pending:
    """A task whose compute ended, its gradients on their way
    (:meth:`TrainerPool.finish`). ``reply`` holds them once read."""

    task: _Task
    trainer: int
    proc: _Proc
    sent: float
    computed: p.Computed
    loaded: bool
    params_sent: bool
    attempts: int
    reply: p.Ran | p.Refused | None = None


class TrainerPool:
    """The resident trainers of one GPU (module doc). ``device``: ``cpu``
    (one core stands in for a GPU) or ``cuda:N``; ``cores``: the GPU's
    CPU cores, or () for no pinning; ``capacity``: models in memory per
    trainer."""

    def __init__(self, count: int = DEFAULT_TRAINERS, *, device: str = "cpu",
                 cores: tuple[int, ...] = (), threads: int = 0, capacity: int = 2,
                 folder: str = "", stderr: IO[bytes] | int | None = None) -> None:
        if count < 1 or capacity < 1:
            raise ValueError(f"need >= 1 trainer and capacity >= 1, got {count}, {capacity}")
        self.device, self.cores, self.threads = device, cores, threads
        self.capacity, self.folder, self.stderr = capacity, folder, stderr
        self.jobs: dict[str, JobSource] = {}
        self._procs = [self._start() for _ in range(count)]

    def _start(self) -> _Proc:
        argv = [sys.executable, "-m", "hops.trainer.resident", "--device", self.device]
        if self.cores:
            argv += ["--cores", ",".join(map(str, self.cores))]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self.stderr, env=_child_env())
        proc = _Proc(popen, queue.SimpleQueue())
        assert popen.stdout is not None
        threading.Thread(target=_reader, args=(popen.stdout, proc.replies), daemon=True,
                         name=f"trainer-{popen.pid}").start()
        ready = self._read(proc)
        if not isinstance(ready, p.Ready):
            raise TrainerDied(f"trainer {popen.pid} said {ready!r} instead of ready")
        return proc

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(proc.popen.pid for proc in self._procs)

    def holding(self) -> tuple[frozenset[str], ...]:
        """The models each trainer holds in memory."""
        return tuple(frozenset(proc.held) for proc in self._procs)

    def owners(self) -> tuple[str | None, ...]:
        """The tenant each trainer serves (None: none yet)."""
        return tuple(proc.tenant for proc in self._procs)

    def add_job(self, job: str, script: str, config: Mapping[str, Any],
                tenant: str = "") -> None:
        self.jobs[job] = JobSource(script, dict(config), tenant)

    def run(self, job: str, round_: int, lo: int, hi: int, sync_scale: int,
            params: Mapping[str, torch.Tensor], upcoming: Sequence[str] = ()) -> TaskResult:
        """:meth:`start` then :meth:`finish`."""
        return self.finish(self.start(job, round_, lo, hi, sync_scale, params, upcoming))

    def start(self, job: str, round_: int, lo: int, hi: int, sync_scale: int,
              params: Mapping[str, torch.Tensor], upcoming: Sequence[str] = ()) -> Pending:
        """Run micro-batches ``lo .. hi - 1`` of ``job``'s round ``round_``
        from the round's ``params``, and return once its compute ended, so
        that the GPU's next task can start while its gradients travel;
        ``upcoming``: the jobs of the GPU's later tasks, in order (for the
        choice of models to keep)."""
        if job not in self.jobs:
            raise TrainerRefused(p.UNKNOWN_JOB, f"job {job!r} was not added to the pool")
        return self._start_task(_Task(job, round_, lo, hi, sync_scale, params,
                                      tuple(upcoming)), 1)

    def _start_task(self, task: _Task, first: int) -> Pending:
        for attempt in range(first, RETRIES + 2):
            # A model moved out counts where it is: it comes back there, not twice.
            holding = [proc.held | ({task.job} & proc.evicted) for proc in self._procs]
            tenant = self.jobs[task.job].tenant
            where = place(holding, [task.job, *task.upcoming], self.capacity,
                          self.owners(), tenant)
            if where.reset:  # another tenant's process: a fresh one
                self._replace(where.trainer)
            self._procs[where.trainer].tenant = tenant
            try:
                return self._start_on(where.trainer, where.evict, task, attempt)
            except TrainerDied:
                if attempt > RETRIES:
                    raise
                self._replace(where.trainer)
        raise AssertionError("unreachable")

    def _start_on(self, i: int, evict: Sequence[str], task: _Task, attempt: int) -> Pending:
        proc, job = self._procs[i], task.job
        for victim in evict:
            self._ask(proc, p.Evict(victim, self.folder))
            proc.held.discard(victim)
            proc.evicted.add(victim)
        loaded = job not in proc.held and job not in proc.evicted
        if loaded:
            source = self.jobs[job]
            self._ask(proc, p.Load(job, source.script, dict(source.config)))
        proc.held.add(job)
        proc.evicted.discard(job)
        wire = None if proc.given.get(job) == task.round else encode_tensors(task.params)
        sent = time.monotonic()
        computed = self._ask(proc, p.Run(job, task.round, task.lo, task.hi, task.sync_scale,
                                         wire))
        assert isinstance(computed, p.Computed)
        proc.given[job] = task.round
        proc.pending = Pending(task, i, proc, sent, computed, loaded, wire is not None, attempt)
        return proc.pending

    def finish(self, pending: Pending) -> TaskResult:
        """``pending``'s gradients; the task runs again, from the same
        parameters, when its trainer died before they came."""
        if pending.proc.pending is pending:
            with contextlib.suppress(TrainerDied):
                self._collect(pending.proc)
        reply = pending.reply
        if reply is None:  # its trainer died: a new one, and the task again
            if self._procs[pending.trainer] is pending.proc:
                self._replace(pending.trainer)
            if pending.attempts > RETRIES:
                raise TrainerDied(f"task {pending.task.job} round {pending.task.round} lost "
                                  f"{pending.attempts} trainers")
            return self.finish(self._start_task(pending.task, pending.attempts + 1))
        if isinstance(reply, p.Refused):
            raise TrainerRefused(reply.code, reply.words)
        c = pending.computed
        return TaskResult(tuple(decode_tensors(g) for g in reply.gradients), pending.trainer,
                          pending.sent, c.received, c.compute_start, c.compute_end, c.reload_s,
                          pending.loaded, pending.params_sent, pending.attempts)

    def forget(self, job: str) -> None:
        """Drop ``job``'s model from every trainer (its job ended)."""
        for proc in self._procs:
            if job in proc.held or job in proc.evicted:
                self._ask(proc, p.Forget(job))
            proc.held.discard(job)
            proc.evicted.discard(job)
            proc.given.pop(job, None)
        self.jobs.pop(job, None)

    def _collect(self, proc: _Proc) -> None:
        """Read the gradients of ``proc``'s pending task into it (they come
        before any later reply); TrainerDied when it ended first."""
        pending, proc.pending = proc.pending, None
        if pending is not None:
            reply = self._read(proc)
            assert isinstance(reply, p.Ran | p.Refused), reply
            pending.reply = reply

    def _ask(self, proc: _Proc, command: p.Command) -> p.Reply:
        self._collect(proc)
        try:
            assert proc.popen.stdin is not None
            proc.popen.stdin.write(p.frame(command))
            proc.popen.stdin.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError) as e:
            raise TrainerDied(f"trainer {proc.popen.pid}: {e}") from None
        reply = self._read(proc)
        if isinstance(reply, p.Refused):
            raise TrainerRefused(reply.code, reply.words)
        return reply

    def _read(self, proc: _Proc) -> p.Reply:
        reply = proc.replies.get()
        if reply is None:
            proc.replies.put(None)  # for whoever reads next
            code = proc.popen.wait()
            raise TrainerDied(f"trainer {proc.popen.pid} ended (exit status {code})")
        return reply

    def _replace(self, i: int) -> None:
        """A new trainer in place of trainer ``i``, which died: its files go."""
        old = self._procs[i].popen
        old.kill()
        old.wait()
        _close_pipes(old)
        folder = evict_folder(self.folder)
        for stale in glob.glob(str(folder / f"hops-trainer-{old.pid}-*.state")):
            os.unlink(stale)
        self._procs[i] = self._start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Quit every trainer (killed after ``timeout_s``)."""
        for proc in self._procs:
            with contextlib.suppress(TrainerDied, TrainerRefused):
                self._ask(proc, p.Quit())
        for proc in self._procs:
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            _close_pipes(proc.popen)

    def __enter__(self) -> TrainerPool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


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


def _close_pipes(popen: subprocess.Popen[bytes]) -> None:
    for pipe in (popen.stdin, popen.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # a dead trainer's unsent bytes
                pipe.close()
