"""``python -m hops.trainer.resident``: a resident trainer process
(docs/hare.md §7, step 4; Hare §4, fast task switching).

It serves :mod:`hops.trainer.protocol` on its stdin and stdout (anything a
script prints goes to stderr: stdout carries only frames) and keeps
several jobs' models in memory between their tasks, so that switching from
one job to another costs no process start, no import and no model build.
A task's intermediate data (graphs, activations, its batches, the
gradients once sent) is freed as the task ends
(:func:`hops.trainer.api.task_gradients`; Hare's early task cleaning).

Options: ``--device`` (``cpu``, default, or ``cuda[:N]``), ``--cores``
(``0,1``: the trainer pins itself with ``os.sched_setaffinity`` before it
computes) and ``--threads`` (torch's intra-op threads; default the number
of cores given, else torch's own); ``--turns``, ``--wake`` and ``--peers``
(the GPU's turns, :mod:`hops.trainer.turns`: a run given a turn is readied,
its parameters and model in place, then waits for that turn, and passes it
on as its compute ends, before its replies are sent); ``--deterministic``
(torch's deterministic algorithms only, cuBLAS's fixed workspace too).

**On a GPU** (run once on an H200, docs/hare.md §7, step 4c): the CUDA
context is made at start, before the first task
(:class:`~hops.trainer.protocol.Ready` says how long it took); an evicted
model is kept in pinned host memory and reloaded layer by layer on a side
stream (:func:`hops.trainer.params.pipelined_reload`); batches are moved to
the device as they are made.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import msgspec
import torch

from hops.trainer import params as state
from hops.trainer import protocol as p
from hops.trainer.api import TaskJob, load_task, task_gradients
from hops.trainer.turns import Gate
from hops.trainer.wire import BadTensor, decode_tensors, encode_tensors


class Refusal(Exception):
    """A command refused, with its code (:data:`protocol.REFUSAL_CODES`)."""

    def __init__(self, code: str, words: str) -> None:
        super().__init__(words)
        self.code = code
        self.words = words


@dataclass
class Resident:
    """A job's model here: ``round`` whose parameters it holds (None: the
    script's seeded ones); ``evicted`` its file while out of memory,
    ``pinned`` its host copy on a GPU."""

    task: TaskJob
    round: int | None
    evicted: Path | None = None
    pinned: dict[str, torch.Tensor] | None = None
    unhook: Callable[[], None] | None = None  # a GPU reload's per-layer waits


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (tensors, possibly in tuples, lists or dicts) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def check_span(run: p.Run) -> None:
    if run.sync_scale < 1 or run.round < 0 or not 0 <= run.lo < run.hi <= run.sync_scale:
        raise Refusal(p.BAD_SPAN, f"need S >= 1, round >= 0 and 0 <= lo < hi <= S, got "
                      f"S = {run.sync_scale}, round {run.round}, lo {run.lo}, hi {run.hi}")


class Trainer:
    """The trainer's state and its answer to each command (no pipe)."""

    def __init__(self, device: torch.device, pid: int, gate: Gate | None = None) -> None:
        self.device = device
        self.pid = pid
        self.gate = gate  # the GPU's turns (hops.trainer.turns); None: none kept
        self.jobs: dict[str, Resident] = {}
        self.stream: Any = (torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
                            if device.type == "cuda" else None)

    def replies(self, command: p.Command) -> Iterator[p.Reply]:
        """The replies to ``command``, each made when the one before is
        sent: a run's gradients are encoded after its :class:`Computed`."""
        try:
            if isinstance(command, p.Run):
                computed, grads = self.run(command)
                yield computed
                yield p.Ran(command.job, command.round, command.lo, command.hi,
                            [encode_tensors(g) for g in grads])
            elif isinstance(command, p.Load):
                yield self.load(command)
            elif isinstance(command, p.Evict):
                yield self.evict(command)
            elif isinstance(command, p.Forget):
                yield self.forget(command)
            else:
                yield p.Bye()
        except Refusal as r:
            yield p.Refused(r.code, r.words, getattr(command, "job", ""))

    def _resident(self, job: str) -> Resident:
        found = self.jobs.get(job)
        if found is None:
            raise Refusal(p.UNKNOWN_JOB, f"no model of job {job!r} here (load it first)")
        return found

    def _given(self, task: TaskJob, tensors: p.Tensors) -> dict[str, torch.Tensor]:
        try:
            given = decode_tensors(tensors)
        except BadTensor as e:
            raise Refusal(p.BAD_PARAMS, str(e)) from None
        why = state.params_problem(task.model, given)
        if why is not None:
            raise Refusal(p.BAD_PARAMS, why)
        return given

    def load(self, cmd: p.Load) -> p.Loaded:
        if cmd.job in self.jobs:
            raise Refusal(p.JOB_EXISTS, f"job {cmd.job!r} is loaded already (forget it first)")
        start = time.monotonic()
        if not Path(cmd.script).is_file():
            raise Refusal(p.NOT_TASK_READY, f"{cmd.script}: no such script")
        try:
            task = load_task(cmd.script, cmd.config)
        except ValueError as e:
            raise Refusal(p.NOT_TASK_READY, str(e)) from None
        except Exception as e:  # the script's own failure, reported rather than fatal
            raise Refusal(p.TASK_FAILED, f"loading {cmd.script}: {type(e).__name__}: {e}") from None
        if cmd.params is not None and cmd.round < 0:
            raise Refusal(p.BAD_SPAN, f"parameters of round {cmd.round}: need round >= 0")
        given = None if cmd.params is None else self._given(task, cmd.params)
        task.model.to(self.device)
        if given is not None:
            state.assign(task.model, given, self.device)
        if self.device.type != "cpu":
            source, device = task.batch, self.device
            task = replace(task, batch=lambda k: to_device(source(k), device))
        self.jobs[cmd.job] = Resident(task, None if given is None else cmd.round)
        return p.Loaded(cmd.job, time.monotonic() - start)

    def run(self, cmd: p.Run) -> tuple[p.Computed, tuple[dict[str, torch.Tensor], ...]]:
        received = time.monotonic()
        try:
            res, reload_s = self._ready(cmd)
        except Refusal:  # refused before its turn: the turn is still passed, in order
            self._wait(cmd.turn)
            self._pass(cmd.turn)
            raise
        ready = time.monotonic()
        self._wait(cmd.turn)
        start = time.monotonic()
        if self.gate is not None and cmd.turn is not None:
            self.gate.begin(cmd.turn)
        try:
            grads = task_gradients(res.task, cmd.round, cmd.lo, cmd.hi, cmd.sync_scale)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as e:
            res.task.model.zero_grad(set_to_none=True)
            raise Refusal(p.TASK_FAILED, f"round {cmd.round}, micro-batches {cmd.lo}.."
                          f"{cmd.hi - 1}: {type(e).__name__}: {e}") from None
        finally:  # the GPU's next task starts now, before this one's replies go
            end = time.monotonic()
            self._pass(cmd.turn)
        if self.gate is not None and cmd.turn is not None:
            self.gate.make_way(cmd.turn)
        if res.unhook is not None:  # every layer is in: its waits are done with
            res.unhook()
            res.unhook = None
        return p.Computed(cmd.job, cmd.round, cmd.lo, cmd.hi, received, start, end,
                          reload_s, ready), grads

    def _ready(self, cmd: p.Run) -> tuple[Resident, float]:
        """The task's model in place with its round's parameters, before its
        turn: ``cmd``'s model and the reload's seconds."""
        check_span(cmd)
        res = self._resident(cmd.job)
        given = None if cmd.params is None else self._given(res.task, cmd.params)
        if given is None and res.round != cmd.round:
            held = "the script's seeded ones" if res.round is None else f"round {res.round}'s"
            raise Refusal(p.STALE_PARAMS, f"job {cmd.job!r}: round {cmd.round} without its "
                          f"parameters, and those held are {held}")
        # Reloaded whole even when parameters are given: its buffers are not.
        reload_s = 0.0 if res.evicted is None else self._reload(res)
        if given is not None:
            state.assign(res.task.model, given, self.device)
            res.round = cmd.round
        return res, reload_s

    def _wait(self, turn: int | None) -> None:
        if self.gate is not None and turn is not None:
            self.gate.wait(turn)

    def _pass(self, turn: int | None) -> None:
        if self.gate is not None and turn is not None:
            self.gate.release(turn)

    def _reload(self, res: Resident) -> float:
        start = time.monotonic()
        if res.pinned is not None:  # a GPU: layer by layer, compute waiting per layer
            res.unhook = state.pipelined_reload(res.task.model, res.pinned, self.device,
                                                self.stream)
        else:
            assert res.evicted is not None
            _, saved = state.load_state(res.evicted)
            state.assign(res.task.model, saved, self.device)
        self._drop_evicted(res)
        return time.monotonic() - start

    def _drop_evicted(self, res: Resident) -> None:
        if res.evicted is not None:
            res.evicted.unlink(missing_ok=True)
        res.evicted, res.pinned = None, None

    def evict(self, cmd: p.Evict) -> p.Evicted:
        res = self._resident(cmd.job)
        if res.evicted is not None:
            return p.Evicted(cmd.job, str(res.evicted), res.evicted.stat().st_size)
        path = state.evict_path(state.evict_folder(cmd.folder), self.pid, cmd.job)
        held = state.state_of(res.task.model)
        nbytes = state.save_state(path, held, res.round)
        if self.device.type == "cuda":
            res.pinned = state.pin(held)
        state.free(res.task.model)
        res.evicted = path
        return p.Evicted(cmd.job, str(path), nbytes)

    def forget(self, cmd: p.Forget) -> p.Forgot:
        self._drop_evicted(self._resident(cmd.job))
        del self.jobs[cmd.job]
        return p.Forgot(cmd.job)

    def close(self) -> None:
        for res in self.jobs.values():
            self._drop_evicted(res)
        self.jobs.clear()


def serve(trainer: Trainer, inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer each command on ``inp`` until ``quit`` or the end of ``inp``."""
    while (body := p.read_frame(inp)) is not None:
        try:
            command = p.decode_command(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            out.write(p.frame(p.Refused(p.BAD_COMMAND, f"not a command: {e}")))
            out.flush()
            continue
        for reply in trainer.replies(command):
            out.write(p.frame(reply))
            out.flush()
        if isinstance(command, p.Quit):
            break
    trainer.close()


def pin(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process to ``cores`` (torch made some as it
    was imported); threads made later inherit it from their maker."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cores)


def _cores(text: str) -> tuple[int, ...]:  # also the peers' descriptors
    return tuple(int(c) for c in text.split(",") if c.strip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cores", type=_cores, default=())
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--turns", default="", help="the GPU's turns' counter file")
    parser.add_argument("--wake", type=int, default=-1, help="this trainer's wake pipe")
    parser.add_argument("--peers", type=_cores, default=(), help="the others' wake pipes")
    parser.add_argument("--deterministic", action="store_true",
                        help="torch's deterministic algorithms only")
    args = parser.parse_args(argv)
    if args.deterministic:
        # cuBLAS is deterministic only with a fixed workspace, read as its
        # handle is made (the job's environment does not pass it on)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    threads = args.threads or len(args.cores)
    if threads:
        torch.set_num_threads(threads)
    if args.cores:
        pin(args.cores)
    out = os.fdopen(os.dup(1), "wb")  # the frames' own descriptor
    os.dup2(2, 1)  # a script's prints go to stderr, never into a frame
    device = torch.device(args.device)
    start = time.monotonic()
    if device.type == "cuda":  # the context made now, not at the first task
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)
    gate = Gate(args.turns, args.wake, args.peers) if args.turns else None
    trainer = Trainer(device, os.getpid(), gate)
    out.write(p.frame(p.Ready(os.getpid(), str(device), time.monotonic() - start)))
    out.flush()
    serve(trainer, sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
