"""The CPU cores a training process runs on, and keeping torch's threads
to them (CODA's adaptive CPU allocation).

The node executor pins every thread of the job to the cores the job holds
and may change them while it runs; it then rewrites the file
``HOPS_CORES_FILE`` names with the new count (:mod:`shared.jobenv`).
:class:`CoresWatch` reads that file at most once a second from the loop
and, when the count changed, sets torch's intra-op threads to this
process's share of it, so that the job neither oversubscribes the cores
it lost nor leaves idle the cores it gained (unless ``HOPS_THREADS`` fixes
the threads). A data loader's worker count cannot change under a running
iterator; a script that wants to resize its loader reads ``run.cores``.

Each ``Sampled`` report carries :func:`affinity_cores`, the cores the
process could run on when the period ended, next to its data times.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import torch

log = logging.getLogger("hops.plugin")
CHECK_EVERY_S = 1.0


def affinity_cores() -> int:
    """The number of cores this process may run on now."""
    return len(os.sched_getaffinity(0))


def read_count(path: Path | None) -> int | None:
    """The count in the cores file (None: no file, or not a count yet)."""
    if path is None:
        return None
    try:
        count = int(path.read_text().strip())
    except (OSError, ValueError):  # not written yet, or being replaced
        return None
    return count if count >= 0 else None


def set_threads(threads: int) -> None:
    """Intra-op threads per process, so processes pinned to their cores do
    not oversubscribe them; inter-op too where torch still allows it (only
    before its first parallel work)."""
    torch.set_num_threads(threads)
    with suppress(RuntimeError):
        torch.set_num_interop_threads(threads)


class CoresWatch:
    """This job's core count on its node, followed from the cores file."""

    def __init__(self, path: Path | None, count: int, processes: int = 1,
                 fixed_threads: int | None = None, every_s: float = CHECK_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.count = count
        self.processes = max(1, processes)
        self.fixed_threads = fixed_threads
        self.every_s = every_s
        self.clock = clock
        self._checked = clock()

    def poll(self) -> bool:
        """Read the file if it is time; True when the count changed (and
        torch's threads followed it)."""
        now = self.clock()
        if self.path is None or now - self._checked < self.every_s:
            return False
        self._checked = now
        count = read_count(self.path)
        if count is None or count == self.count:
            return False
        log.info("the job now holds %d cores (it held %d)", count, self.count)
        self.count = count
        if count and self.fixed_threads is None:
            torch.set_num_threads(max(1, count // self.processes))
        return True
