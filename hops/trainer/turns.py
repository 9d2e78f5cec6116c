"""A GPU's compute turns, handed from trainer to trainer without the pool
(docs/hare.md §7, step 4; Hare §4, fast task switching).

The GPU's tasks compute one at a time, in the order its pool numbered them:
task ``n`` (its *turn*) computes once ``done >= n`` and sets ``done = n + 1``
as its compute ends, or as it is refused (a turn is passed whatever
happens). ``done`` is one 64-bit counter in a small file in shared memory,
mapped by the pool and by every trainer of the GPU. So the next task can be
sent to an idle trainer while the current one computes: it decodes its
parameters and puts its model in place, then waits, and starts as soon as
the running trainer passes the turn, one process wake later, with no
message through the pool in between.

A waiter sleeps on its own wake pipe; a trainer passing a turn stores the
counter, then writes one byte to every other trainer's pipe (non-blocking:
a full pipe holds wakes enough). The waiter empties its pipe, then reads
the counter, then sleeps: the counter is stored before the byte is written,
so no turn's end is missed. It also looks again every ``RECHECK_S``, and
leaves when the process that started it is gone.

**The next task first, the last one's gradients after** (Hare overlaps a
task's sync with the next task's compute; here both are CPU work on the
same cores): two more counters say how many turns have begun (a task
stores it as its compute starts, and wakes the others) and how many tasks
the pool has sent. A trainer whose compute ended, while a later task was
sent already, waits until that task has begun, at most ``YIELD_S``, before
it sends its replies and encodes its gradients.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import tempfile
import time
from pathlib import Path
from typing import Final

RECHECK_S: Final = 1.0  # a waiter looks at the counter at least this often
YIELD_S: Final = 0.02  # the longest a task's replies wait for the next task's start
_DONE, _BEGUN, _SENT = 0, 1, 2  # the counters: turns passed, turns begun, tasks sent
_WORDS: Final = 3  # int64s, aligned, so that each load and store is whole
_SIZE: Final = 8 * _WORDS


class Gate:
    """One process's end of a GPU's turns: the counter at ``path``, its own
    wake pipe's read end ``wake`` (-1: this process never waits) and the
    other trainers' write ends ``peers``."""

    def __init__(self, path: str, wake: int = -1, peers: tuple[int, ...] = ()) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self._words: ctypes.Array[ctypes.c_int64] | None = \
            (ctypes.c_int64 * _WORDS).from_buffer(self._map)
        self.wake, self.peers = wake, peers
        self._parent = os.getppid()

    def _get(self, word: int) -> int:
        assert self._words is not None
        return int(self._words[word])

    def _raise(self, word: int, value: int) -> None:
        """The counter ``word`` to ``value``, if that is more (none goes back)."""
        assert self._words is not None
        if self._words[word] < value:
            self._words[word] = value

    def done(self) -> int:
        """The turns passed so far."""
        return self._get(_DONE)

    def wait(self, turn: int) -> None:
        """Return once turn ``turn`` has come (``done >= turn``)."""
        while True:
            self._empty()
            if self.done() >= turn:
                return
            ready, _, _ = select.select([self.wake], [], [], RECHECK_S)
            if not ready and os.getppid() != self._parent:
                raise SystemExit(f"waiting for turn {turn}: the pool is gone")

    def begin(self, turn: int) -> None:
        """Turn ``turn``'s compute starts (the one before may send its replies)."""
        self._raise(_BEGUN, turn + 1)
        self._wake_peers()

    def release(self, turn: int) -> None:
        """Turn ``turn`` ended: the next may start."""
        self._raise(_DONE, turn + 1)
        self._wake_peers()

    def sent(self, turn: int) -> None:
        """The pool sent turn ``turn``'s task."""
        self._raise(_SENT, turn + 1)

    def make_way(self, turn: int) -> None:
        """After turn ``turn`` passed: return once the next turn has begun (or
        passed: refused), at once when no later task was sent, at the latest
        after ``YIELD_S``."""
        deadline = time.monotonic() + YIELD_S
        nxt = turn + 1
        while self._get(_SENT) > nxt and self._get(_BEGUN) <= nxt and self.done() <= nxt:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([self.wake], [], [], left)
            self._empty()

    def _wake_peers(self) -> None:
        for fd in self.peers:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(fd, b"\0")

    def _empty(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake, 4096):
                pass

    def close(self) -> None:
        self._words = None  # the map can close only once nothing points into it
        self._map.close()


class Turns:
    """A pool's turns (module doc): the counter's file in ``folder``, one wake
    pipe per trainer place; :meth:`take` numbers the GPU's tasks."""

    def __init__(self, places: int, folder: Path) -> None:
        fd, self.path = tempfile.mkstemp(prefix="hops-turns-", suffix=".bin", dir=folder)
        try:
            os.ftruncate(fd, _SIZE)
        finally:
            os.close(fd)
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        self.pipes = [os.pipe2(flags) for _ in range(places)]
        self.gate = Gate(self.path, peers=tuple(w for _, w in self.pipes))
        self._next = 0

    def take(self) -> int:
        """The next task's turn."""
        self._next += 1
        return self._next - 1

    def argv(self, place: int) -> tuple[list[str], tuple[int, ...]]:
        """A trainer's options for place ``place``, and the descriptors it inherits."""
        wake = self.pipes[place][0]
        peers = tuple(w for i, (_, w) in enumerate(self.pipes) if i != place)
        return (["--turns", self.path, "--wake", str(wake), "--peers",
                 ",".join(map(str, peers))], (wake, *peers))

    def sent(self, turn: int) -> None:
        """Turn ``turn``'s task is sent (before its command is written)."""
        self.gate.sent(turn)

    def abandon(self, turn: int) -> None:
        """Pass turn ``turn`` for a task given up (its trainers kept dying)."""
        self.gate.release(turn)

    def close(self) -> None:
        self.gate.close()
        for r, w in self.pipes:
            os.close(r)
            os.close(w)
        Path(self.path).unlink(missing_ok=True)
