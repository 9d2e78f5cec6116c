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

**The next task is readied while the current one computes** (Hare §4:
a switch of at most 6 ms). :meth:`TrainerPool.stage` sends a task to its
trainer at once, with its turn in the GPU's order (:mod:`hops.trainer.
turns`): the trainer decodes the round's parameters and puts its model in
place (reloaded when it was moved out), then waits; the trainer computing
before it passes the turn as its compute ends, through shared memory and a
wake pipe, not through the pool, and sends its ``computed`` and its
gradients only once the next task has begun (at most ``YIELD_S`` later):
the gradients travel while the next task computes. :meth:`TrainerPool.
start` is :meth:`~TrainerPool.stage`, returning once the task's compute
ended; :meth:`TrainerPool.finish` returns the gradients, which a reader
thread per trainer takes off its pipe meanwhile; :meth:`TrainerPool.run` is
both. A task is staged on another trainer than the one computing when the
choice rule puts it there (it spreads the GPU's jobs over its trainers);
sent to a trainer with a task still to finish, it waits for that task's
compute to end, not for its gradients: those are read later, in order
(the trainer sends them before it reads the next command, which is then
there already).
The pool reads the tasks' ``computed`` in turn order, so that a trainer
that died under a task is replaced, and the task run again, before a later
task waits on its turn; a task refused, or given up, still passes its turn.

Blocking calls: an asyncio shell runs them in a thread (the real
executor's task work, :mod:`executor.realwork`, one pool per GPU).
"""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Final

import torch

from executor.settings import ExecutorSettings
from executor.trainer_choice import place
from executor.trainer_procs import (
    JobSource,
    Pending,
    Proc,
    Task,
    TaskResult,
    TrainerDied,
    TrainerRefused,
    ask,
    close_pipes,
    read,
    send,
    spawn,
)
from hops.trainer import protocol as p
from hops.trainer.params import evict_folder
from hops.trainer.turns import Turns
from hops.trainer.wire import decode_tensors, encode_tensors

__all__ = ["DEFAULT_TRAINERS", "RETRIES", "JobSource", "Pending", "TaskResult", "TrainerDied",
           "TrainerPool", "TrainerRefused"]

DEFAULT_TRAINERS: Final = ExecutorSettings.trainers_per_gpu
RETRIES: Final = 2  # reruns of a task whose trainer died


class TrainerPool:
    """The resident trainers of one GPU (module doc). ``device``: ``cpu``
    (one core stands in for a GPU) or ``cuda:N``; ``cores``: the GPU's
    CPU cores, or () for no pinning; ``capacity``: models in memory per
    trainer; ``deterministic``: the trainers use torch's deterministic
    algorithms only (on a GPU, cuDNN's convolution gradients otherwise
    differ from run to run in their last bits)."""

    def __init__(self, count: int = DEFAULT_TRAINERS, *, device: str = "cpu",
                 cores: tuple[int, ...] = (), threads: int = 0, capacity: int = 2,
                 folder: str = "", stderr: IO[bytes] | int | None = None,
                 deterministic: bool = False) -> None:
        if count < 1 or capacity < 1:
            raise ValueError(f"need >= 1 trainer and capacity >= 1, got {count}, {capacity}")
        self.device, self.cores, self.threads = device, cores, threads
        self.deterministic = deterministic
        self.capacity, self.folder, self.stderr = capacity, folder, stderr
        self.jobs: dict[str, JobSource] = {}
        self._turns = Turns(count, evict_folder(folder))
        self._unsettled: list[Pending] = []  # sent, not computed yet, in turn order
        self._procs: list[Proc] = []
        self._procs = [self._start(i) for i in range(count)]

    def _start(self, place: int) -> Proc:
        turns, fds = self._turns.argv(place)
        return spawn(self.device, self.cores, self.threads, turns, fds, self.stderr,
                     self.deterministic)

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
        """:meth:`stage`, and return once its compute ended (TrainerRefused
        or TrainerDied at once when it was refused or lost)."""
        pending = self.stage(job, round_, lo, hi, sync_scale, params, upcoming)
        self._settle(pending)
        if pending.lost is not None:
            raise TrainerDied(pending.lost)
        if isinstance(pending.reply, p.Refused):
            raise TrainerRefused(pending.reply.code, pending.reply.words)
        return pending

    def stage(self, job: str, round_: int, lo: int, hi: int, sync_scale: int,
              params: Mapping[str, torch.Tensor], upcoming: Sequence[str] = ()) -> Pending:
        """Send micro-batches ``lo .. hi - 1`` of ``job``'s round ``round_``,
        from the round's ``params``, to a trainer, and return: the task
        computes after the tasks staged before it, as soon as the last of them
        ends, its parameters and model in place by then (a trainer still busy
        with an earlier task is waited for first); ``upcoming``: the jobs of
        the GPU's later tasks, in order (for the choice of models to keep)."""
        if job not in self.jobs:
            raise TrainerRefused(p.UNKNOWN_JOB, f"job {job!r} was not added to the pool")
        task = Task(job, round_, lo, hi, sync_scale, params, tuple(upcoming),
                    self._turns.take())
        try:
            pending = self._start_task(task)
        except BaseException:  # never sent: its turn is passed after those before it
            while self._unsettled:
                self._settle(self._unsettled[-1])
            self._turns.abandon(task.turn)
            raise
        self._unsettled.append(pending)
        return pending

    def _start_task(self, task: Task) -> Pending:
        attempt = 1
        while True:
            # A model moved out counts where it is: it comes back there, not twice.
            holding = [proc.held | ({task.job} & proc.evicted) for proc in self._procs]
            where = place(holding, [task.job, *task.upcoming], self.capacity,
                          self.owners(), self.jobs[task.job].tenant)
            busy = self._procs[where.trainer].pending
            if busy is not None:  # its last task's compute first, then the choice again
                self._release(busy)
                continue
            if where.reset:  # another tenant's process: a fresh one
                self._drain(self._procs[where.trainer])
                self._replace(where.trainer)
            try:
                return self._start_on(where.trainer, where.evict, task, attempt)
            except TrainerDied:
                if attempt > RETRIES:
                    raise
                attempt += 1
                self._replace(where.trainer)

    def _start_on(self, i: int, evict: Sequence[str], task: Task, attempt: int) -> Pending:
        proc, job = self._procs[i], task.job
        if evict or job not in proc.held | proc.evicted:  # an answer to wait for: after theirs
            self._drain(proc)
        proc.tenant = self.jobs[job].tenant
        for victim in evict:
            ask(proc, p.Evict(victim, self.folder))
            proc.held.discard(victim)
            proc.evicted.add(victim)
        loaded = job not in proc.held and job not in proc.evicted
        if loaded:
            source = self.jobs[job]
            ask(proc, p.Load(job, source.script, dict(source.config)))
        proc.held.add(job)
        proc.evicted.discard(job)
        wire = None if proc.given.get(job) == task.round else encode_tensors(task.params)
        sent = time.monotonic()
        self._turns.sent(task.turn)
        send(proc, p.Run(job, task.round, task.lo, task.hi, task.sync_scale, wire, task.turn))
        proc.pending = Pending(task, i, proc, sent, loaded, wire is not None, attempt)
        return proc.pending

    def finish(self, pending: Pending) -> TaskResult:
        """``pending``'s gradients, once its compute ended; the task runs
        again, from the same parameters, when its trainer died before they
        came."""
        self._complete(pending)
        if pending.lost is not None:
            raise TrainerDied(pending.lost)
        reply, c = pending.reply, pending.computed
        if isinstance(reply, p.Refused):
            raise TrainerRefused(reply.code, reply.words)
        assert isinstance(reply, p.Ran) and c is not None
        return TaskResult(tuple(decode_tensors(g) for g in reply.gradients), pending.trainer,
                          pending.sent, c.received, c.compute_start, c.compute_end, c.reload_s,
                          pending.loaded, pending.params_sent, pending.attempts, c.ready)

    def forget(self, job: str) -> None:
        """Drop ``job``'s model from every trainer (its job ended)."""
        for i in range(len(self._procs)):
            self._complete_on(i)
            proc = self._procs[i]
            if job in proc.held or job in proc.evicted:
                ask(proc, p.Forget(job))
            proc.held.discard(job)
            proc.evicted.discard(job)
            proc.given.pop(job, None)
        self.jobs.pop(job, None)

    def _settle(self, pending: Pending) -> None:
        """Read the ``computed`` of ``pending`` and of every task before it,
        in turn order (a later one computes only after them: a trainer that
        died under one is replaced here, so that its turn comes)."""
        while pending in self._unsettled:
            self._take_computed(self._unsettled.pop(0))

    def _take_computed(self, pending: Pending) -> None:
        while True:
            self._drain(pending.proc)  # the gradients of its trainer's earlier tasks come first
            try:
                reply = read(pending.proc)
            except TrainerDied:
                if self._rerun(pending):
                    continue
                return
            if isinstance(reply, p.Computed):
                pending.computed = reply
                pending.proc.given[pending.task.job] = pending.task.round
            else:
                assert isinstance(reply, p.Refused), reply
                pending.reply = reply  # nothing more comes for it
                pending.proc.pending = None
            return

    def _complete(self, pending: Pending) -> None:
        """Read ``pending``'s replies, all of them: its computed, then its
        gradients; when its trainer died first, a new one runs it again."""
        self._settle(pending)
        self._drain(pending.proc, pending if pending in pending.proc.finishing else None)
        self._read_gradients(pending)

    def _release(self, pending: Pending) -> None:
        """``pending``'s trainer may take its next task once ``pending``'s
        compute is counted: its gradients are read later (:meth:`_drain`),
        so that the next command reaches the trainer as they travel."""
        self._settle(pending)
        if pending.reply is None and pending.lost is None and pending.proc.pending is pending:
            pending.proc.finishing.append(pending)
            pending.proc.pending = None
        else:
            self._complete(pending)

    def _drain(self, proc: Proc, upto: Pending | None = None) -> None:
        """Read the gradients of ``proc``'s tasks in ``finishing``, oldest
        first: all of them, or up to ``upto``."""
        while proc.finishing:
            older = proc.finishing.popleft()
            self._read_gradients(older)
            if older is upto:
                return

    def _read_gradients(self, pending: Pending) -> None:
        """``pending``'s gradients (its computed counted), read; when its
        trainer died first, a new one runs it again."""
        while pending.reply is None and pending.lost is None:
            try:
                reply = read(pending.proc)
                assert isinstance(reply, p.Ran | p.Refused), reply
                pending.reply = reply
            except TrainerDied:
                if self._rerun(pending):
                    self._take_computed(pending)
        if pending.proc.pending is pending:
            pending.proc.pending = None

    def _complete_on(self, i: int) -> None:
        pending = self._procs[i].pending
        if pending is not None:
            self._complete(pending)
        self._drain(self._procs[i])

    def _rerun(self, pending: Pending) -> bool:
        """``pending``'s trainer died: the task again, from the same
        parameters and in its turn, on a new trainer in its place; False
        when it is given up (its turn passed, ``lost`` or ``reply`` why)."""
        task, i = pending.task, pending.trainer
        if self._procs[i] is pending.proc:
            self._replace(i)
        while pending.attempts <= RETRIES:
            try:
                pending.adopt(self._start_on(i, (), task, pending.attempts + 1))
                return True
            except TrainerDied:
                pending.attempts += 1
                self._replace(i)
            except TrainerRefused as e:
                pending.reply = p.Refused(e.code, e.words, task.job)
                break
        else:
            pending.lost = f"task {task.job} round {task.round} lost {pending.attempts} trainers"
        if pending.proc.pending is pending:
            pending.proc.pending = None
        self._turns.abandon(task.turn)
        return False

    def _replace(self, i: int) -> None:
        """A new trainer in place of trainer ``i`` (it died, or served
        another tenant): its files go."""
        old = self._procs[i].popen
        old.kill()
        old.wait()
        close_pipes(old)
        folder = evict_folder(self.folder)
        for stale in glob.glob(str(folder / f"hops-trainer-{old.pid}-*.state")):
            os.unlink(stale)
        self._procs[i] = self._start(i)

    def close(self, timeout_s: float = 5.0) -> None:
        """Quit every trainer (killed after ``timeout_s``)."""
        for i in range(len(self._procs)):
            with contextlib.suppress(TrainerDied, TrainerRefused):
                self._complete_on(i)
                ask(self._procs[i], p.Quit())
        for proc in self._procs:
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            close_pipes(proc.popen)
        self._turns.close()

    def __enter__(self) -> TrainerPool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
