"""Holding a running job to its cores: every thread of every process of its
process group is pinned with ``sched_setaffinity`` on its thread id.

A process's affinity is per thread and a new thread or child inherits its
creator's, so pinning each rank right after it starts covers what it
starts later. The executor still re-pins the whole group on a short
cadence (:class:`Pinner`): threads created in the instant between the
start and the first pin, a job that resets its own affinity (some
libraries pin their workers), and above all a ``set_cores`` change, which
has to reach threads that already run. No privilege is needed for
processes of the executor's own user; for a job run as another user the
executor runs as root, which may.

The job learns its current count from the file ``HOPS_CORES_FILE`` names
(:mod:`shared.jobenv`): one line, the number, replaced whole (written to a
temporary file and renamed, so a reader never sees half of it, and a link
the job put at that name is replaced rather than followed).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

from executor.adopt import group_members

PIN_EVERY_S = 1.0  # how soon a thread that escaped its cores is brought back


def group_threads(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """The thread ids of every running process of process group ``pgid``."""
    tids: list[int] = []
    for pid in group_members(pgid, proc):
        with contextlib.suppress(OSError):  # it ended meanwhile
            tids.extend(int(t.name) for t in (proc / str(pid) / "task").iterdir()
                        if t.name.isdigit())
    return tids


def pin_threads(tids: Iterable[int], cores: tuple[int, ...]) -> int:
    """Pin each of ``tids`` to exactly ``cores``; how many were pinned (a
    thread that ended meanwhile, or is not ours, is skipped)."""
    wanted = set(cores)
    pinned = 0
    for tid in tids:
        try:
            if os.sched_getaffinity(tid) != wanted:
                os.sched_setaffinity(tid, wanted)
            pinned += 1
        except (ProcessLookupError, PermissionError):
            continue
        except OSError:  # EINVAL: none of the cores is online any more
            continue
    return pinned


def pin_group(pgid: int, cores: tuple[int, ...], proc: Path = Path("/proc")) -> int:
    """Pin every thread of process group ``pgid`` to ``cores``."""
    return pin_threads(group_threads(pgid, proc), cores) if cores else 0


def write_count(path: Path, count: int) -> None:
    """Replace ``path`` with one line holding ``count`` (see the module)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a crash, or put there by the job: never written through
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        os.write(fd, f"{count}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Pinner:
    """The cores one job on this node is held to, and when it was last
    pinned; ``cores`` empty: the executor does not pin it."""

    def __init__(self, pgid: int, cores: tuple[int, ...], count_file: Path | None,
                 every_s: float = PIN_EVERY_S) -> None:
        self.pgid = pgid
        self.cores = cores
        self.count_file = count_file
        self.every_s = every_s
        self._last = float("-inf")

    def due(self) -> bool:
        return bool(self.cores) and time.monotonic() - self._last >= self.every_s

    def pin(self) -> int:
        """Pin the group now; the number of threads pinned."""
        self._last = time.monotonic()
        return pin_group(self.pgid, self.cores)

    def change(self, cores: tuple[int, ...], count: int) -> int:
        """Hold the job to ``cores`` from now on (``count``: what it is
        told it holds) and re-pin at once; OSError when the count file
        cannot be written (the pinning is done by then)."""
        self.cores = cores
        # No cores any more: free the job to run anywhere the executor may.
        pinned = self.pin() if cores else pin_group(self.pgid, tuple(os.sched_getaffinity(0)))
        if self.count_file is not None:  # last: the cores changed, even if the job is not told
            write_count(self.count_file, count)
        return pinned
