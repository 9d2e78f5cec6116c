"""How much of this host's CPU went to work other than the study's own.

The study's processes (this one and its descendants: nats-server, the
executors, the training processes) share two cores with whatever else runs
here. :class:`Meter` reads ``/proc/stat`` (all CPU time, and the time the
hypervisor took, *steal*) and ``/proc/<pid>/stat`` of the study's process
tree; between two readings, the *foreign* share is the CPU time spent
outside the tree, as a fraction of all cores' time. A run whose foreign
share is high was disturbed.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Reading:
    """One reading of the host's and the tree's CPU counters."""

    wall: float
    busy: int  # jiffies of all CPUs, not idle
    steal: int
    tree: dict[int, int]  # pid -> CPU jiffies of the study's processes and their reaped children


@dataclass(frozen=True)
class Share:
    """Fractions of all cores' time between two readings."""

    foreign: float
    steal: float
    seconds: float


def _host() -> tuple[int, int]:
    fields = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    steal = fields[7] if len(fields) > 7 else 0
    return sum(fields[:8]) - idle - steal, steal


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime + stime + cutime + cstime) of ``pid``, or None if it is
    gone: a child that ended and was reaped moves its time to its parent's
    cutime and cstime, so the tree's total stays whole."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[1].split()  # fields after the command name
    return int(rest[1]), sum(int(v) for v in rest[11:15])


def _tree(root: int) -> dict[int, int]:
    stats: dict[int, tuple[int, int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                stats[int(entry.name)] = got
    mine, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in mine:
                mine.add(pid)
                frontier.append(pid)
    return {pid: stats[pid][1] for pid in mine if pid in stats}


class Meter:
    """Readings of the host and of this process's tree (see the module)."""

    def __init__(self) -> None:
        self.cores = len(os.sched_getaffinity(0))
        self.hz = os.sysconf("SC_CLK_TCK")

    def read(self) -> Reading:
        """A reading now."""
        busy, steal = _host()
        return Reading(time.monotonic(), busy, steal, _tree(os.getpid()))

    def share(self, a: Reading, b: Reading) -> Share:
        """Foreign and steal shares between readings ``a`` and ``b``."""
        seconds = max(b.wall - a.wall, 1e-9)
        total = seconds * self.cores * self.hz
        own = sum(b.tree[p] - a.tree.get(p, 0) for p in b.tree)
        foreign = max(0, (b.busy - a.busy) - own)
        return Share(foreign / total, (b.steal - a.steal) / total, seconds)

    async def quiet(self, limit: float, window: float = 2.0, timeout: float = 120.0) -> Share:
        """Wait until a ``window`` with a foreign share at most ``limit``
        (or ``timeout``); that window's share."""
        deadline = time.monotonic() + timeout
        while True:
            a = self.read()
            await asyncio.sleep(window)
            got = self.share(a, self.read())
            if got.foreign <= limit or time.monotonic() > deadline:
                return got
