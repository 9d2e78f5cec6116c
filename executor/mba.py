"""Capping a job's memory bandwidth with Intel MBA, through Linux resctrl.

CODA's contention eliminator (§V-D) throttles a CPU job's memory bandwidth
with Memory Bandwidth Allocation when its node's bandwidth passes 75% and
a GPU job there slows (the placer sends ``set_cores`` with ``mba_percent``).
resctrl (``/sys/fs/resctrl``) does it per *control group*: a directory made
under the root whose ``schemata`` line ``MB:0=50;1=50`` caps every thread
listed in its ``tasks`` at 50% on MB domains 0 and 1; a thread id written
to a group's ``tasks`` (one per write) moves that thread there, its later
threads and children inherit its group, and the root's ``tasks`` takes a
thread back uncapped.

A CPU has few groups (``info/MB/num_closids``, often 8 to 16) and a node
may run many jobs, so there is ONE group per cap level, ``hops-mba-<level>``,
shared by every job at that level, and a group left empty is removed
(:meth:`MbaControl.prune`). The level is the percent rounded up to
``info/MB/bandwidth_gran`` and raised to ``info/MB/min_bandwidth`` (10 and
10 where those files are missing): the kernel takes no other value, and
rounding up never throttles a job more than it was asked.

:class:`JobCap` keeps one job's threads in its level's group, as
:class:`executor.pinning.Pinner` keeps them on their cores: a thread made
in the instant before the first move is caught on the next pass.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from executor.membw import RESCTRL
from executor.pinning import PIN_EVERY_S, group_threads

PREFIX = "hops-mba-"
DEFAULT_GRAN = DEFAULT_MIN = 10  # percent, where info/MB does not say
WARN_EVERY_S = 60.0  # how often a cap that cannot be kept is said
_CANNOT = {errno.EACCES: "permission denied", errno.EPERM: "not permitted",
           errno.ENOSPC: "no resctrl group (CLOSID) is left", errno.EROFS: "read-only"}


class MbaError(Exception):
    """The cap cannot be applied here (no resctrl or MBA, no permission,
    no group left); the message says which."""


def mb_line(schemata: str) -> dict[str, str]:
    """A ``schemata`` text's ``MB:`` line as domain id -> value, in order
    (empty: no MB line, no MBA)."""
    for line in schemata.splitlines():
        head, _, entries = line.strip().partition(":")
        if head == "MB":
            pairs = (e.split("=", 1) for e in entries.split(";") if "=" in e)
            return {d.strip(): v.strip() for d, v in pairs}
    return {}


def cap_level(percent: int, gran: int, low: int) -> int:
    """``percent`` rounded up to a multiple of ``gran`` and raised to
    ``low``: the least cap the kernel takes that is not harder (100: none)."""
    gran = max(1, gran)
    return min(100, max(-(-percent // gran) * gran, low))


def _read_int(path: Path, default: int) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _why(e: OSError) -> str:
    return _CANNOT.get(e.errno or 0, e.strerror or str(e))


class MbaControl:
    """The ``hops-mba-*`` groups of the resctrl tree at ``root``."""

    def __init__(self, root: Path = RESCTRL) -> None:
        self.root = root

    def level(self, percent: int) -> int:
        """The cap the kernel is given for ``percent`` (100: none)."""
        info = self.root / "info" / "MB"
        return cap_level(percent, _read_int(info / "bandwidth_gran", DEFAULT_GRAN),
                         _read_int(info / "min_bandwidth", DEFAULT_MIN))

    def group(self, percent: int) -> Path:
        """The directory of ``percent``'s level (the root for no cap),
        made and its ``schemata`` written when needed."""
        level = self.level(percent)
        if level >= 100:
            return self.root
        try:
            root_schemata = (self.root / "schemata").read_text()
        except OSError as e:
            raise MbaError(f"resctrl is not available at {self.root} ({_why(e)}): "
                           "memory bandwidth cannot be capped") from None
        domains = mb_line(root_schemata)
        if not domains:
            raise MbaError(f"resctrl at {self.root} has no memory bandwidth allocation (MBA)")
        if set(domains.values()) != {"100"}:  # AMD's GB/s units, or mounted with mba_MBps
            raise MbaError(f"resctrl at {self.root} does not take MB caps in percent "
                           f"(root MB line {domains}): not supported")
        path = self.root / f"{PREFIX}{level}"
        made = not path.is_dir()
        try:
            path.mkdir(exist_ok=True)
        except OSError as e:
            closids = _read_int(self.root / "info" / "MB" / "num_closids", 0)
            raise MbaError(f"cannot make resctrl group {path} ({_why(e)}; the CPU has "
                           f"{closids or 'an unknown number of'} groups)") from None
        line = "MB:" + ";".join(f"{d}={level}" for d in domains) + "\n"
        try:
            with open(path / "schemata", "w") as f:
                f.write(line)
        except OSError as e:
            status = self.root / "info" / "last_cmd_status"
            detail = status.read_text().strip() if status.is_file() else ""
            if made:
                self._remove(path)
            raise MbaError(f"cannot write {line.strip()!r} to {path / 'schemata'} "
                           f"({_why(e)}{'; ' + detail if detail else ''})") from None
        return path

    def apply(self, pgid: int, percent: int, tids: Iterable[int]) -> int:
        """Move ``tids`` (of process group ``pgid``) into ``percent``'s
        group, or back to the root for 100; how many moved (a thread that
        ended meanwhile is skipped)."""
        tasks, moved = self.group(percent) / "tasks", 0
        try:
            fd = os.open(tasks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise MbaError(f"cannot open {tasks} for process group {pgid} ({_why(e)})") from None
        try:
            for tid in tids:
                try:
                    os.write(fd, f"{tid}\n".encode())  # one thread id per write
                    moved += 1
                except OSError as e:
                    if e.errno == errno.ESRCH:  # it ended meanwhile
                        continue
                    raise MbaError(f"cannot move thread {tid} of process group {pgid} to "
                                   f"{tasks} ({_why(e)})") from None
        finally:
            os.close(fd)
        return moved

    def prune(self) -> list[str]:
        """Remove the ``hops-mba-*`` groups no thread is in; their names."""
        try:
            groups = sorted(p for p in self.root.iterdir()
                            if p.name.startswith(PREFIX) and p.is_dir())
        except OSError:
            return []
        removed = []
        for path in groups:
            try:
                empty = not (path / "tasks").read_text().strip()
            except FileNotFoundError:
                empty = True
            except OSError:
                continue
            if empty and self._remove(path):
                removed.append(path.name)
        return removed

    @staticmethod
    def _remove(path: Path) -> bool:
        """rmdir a group (the kernel moves any task left to the root). A
        plain directory (a copy of the tree) needs its files gone first."""
        try:
            try:
                path.rmdir()
            except OSError as e:  # the kernel never answers ENOTEMPTY for a group
                if e.errno != errno.ENOTEMPTY:
                    raise
                for f in path.iterdir():
                    f.unlink()
                path.rmdir()
        except OSError:
            return False
        return True


class JobCap:
    """One job's cap on this node (100: none), kept on every thread of its
    process group."""

    def __init__(self, control: MbaControl, pgid: int, percent: int = 100,
                 every_s: float = PIN_EVERY_S,
                 threads: Callable[[int], list[int]] = group_threads) -> None:
        self.control = control
        self.pgid = pgid
        self.percent = percent
        self.every_s = every_s
        self.threads = threads
        self.touched = percent < 100  # it has been in a group: prune when it ends
        self._last = self._warned = float("-inf")

    def set(self, percent: int) -> int:
        """Cap the job at ``percent`` now; how many threads moved. MbaError:
        nothing changed, the job keeps its cap."""
        if percent >= 100 and self.percent >= 100:
            return 0  # never capped: resctrl need not even exist
        self._last = time.monotonic()
        tids = self.threads(self.pgid)
        try:
            moved = self.control.apply(self.pgid, percent, tids)
        except MbaError:
            with contextlib.suppress(MbaError):  # those moved before the error: back
                self.control.apply(self.pgid, self.percent, tids)
            raise
        old, self.percent, self.touched = self.percent, percent, True
        if self.control.level(old) != self.control.level(percent):
            self.control.prune()  # the old level's group may be empty now
        return moved

    def due(self) -> bool:
        return self.percent < 100 and time.monotonic() - self._last >= self.every_s

    def keep(self) -> str | None:
        """Move the threads made since the last pass; why it failed, said
        once a minute at most (e.g. resctrl was unmounted), else None."""
        now = self._last = time.monotonic()
        try:
            self.control.apply(self.pgid, self.percent, self.threads(self.pgid))
        except MbaError as e:
            if now - self._warned >= WARN_EVERY_S:
                self._warned = now
                return str(e)
        return None

    def end(self) -> list[str]:
        """The job ended: remove the groups left empty."""
        return self.control.prune() if self.touched else []
