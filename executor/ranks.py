"""The OS processes of a real job on one node: starting them in one process
group, signalling the group, and telling when each ended.

Local rank 0 leads a new process group and the other ranks join it, so
one signal reaches every process of the job, including the processes a
rank starts itself (data-loader workers), and nothing else. The group is
not the executor's, so the job outlives the executor: a Ctrl-C at the
executor's terminal, the executor's death or ``hops up`` killing what is
left of the executor's group do not reach it. (Rank 0 cannot start a new
session instead: a process may only join a group of its own session, so
the other ranks could not join rank 0's.) Each process writes stdout and stderr to its own log
file, appended to, after a header line naming the start.

A process the executor started is its child and its exit code is known. A
process adopted after a restart is not: it is watched through ``/proc``
(:mod:`executor.adopt`) and its exit code stays unknown.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from executor.adopt import RankRecord, running, start_time
from executor.isolation import open_job_file
from executor.launch import RankLaunch


class Rank(Protocol):
    """One process of a job."""

    local_rank: int
    pid: int

    def ended(self) -> tuple[bool, int | None]:
        """``(ended, exit code)``; the code is None when it cannot be known."""

    def record(self) -> RankRecord:
        """What the state file keeps of it."""


class ChildRank:
    """A process this executor started (its exit code is known)."""

    def __init__(self, local_rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.local_rank = local_rank
        self.proc = proc
        self.pid = proc.pid
        # Read at once: the pid stays ours until we reap it, so this is its time.
        self.start_time = start_time(proc.pid) or 0

    def ended(self) -> tuple[bool, int | None]:
        code = self.proc.poll()
        return code is not None, code

    def record(self) -> RankRecord:
        return RankRecord(self.local_rank, self.pid, self.start_time)


class AdoptedRank:
    """A process started by an earlier run of this executor."""

    def __init__(self, rec: RankRecord, proc_root: Path = Path("/proc")) -> None:
        self.local_rank = rec.local_rank
        self.pid = rec.pid
        self.rec = rec
        self.proc_root = proc_root

    def ended(self) -> tuple[bool, int | None]:
        return not running(self.pid, self.rec.start_time, self.proc_root), None

    def record(self) -> RankRecord:
        return self.rec


def header(launch: RankLaunch, what: str) -> bytes:
    """The line a log file gets before each start."""
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return (f"==== {when} {what}, local rank {launch.local_rank}, rank "
            f"{launch.env.get('RANK', '?')} of {launch.env.get('WORLD_SIZE', '?')}: "
            f"{shlex.join(launch.argv)}\n").encode()


class LaunchError(RuntimeError):
    """The job's program could not be started (not found, not executable)."""


def _start_one(launch: RankLaunch, what: str, pgid: int | None) -> subprocess.Popen[bytes]:
    launch.log.parent.mkdir(parents=True, exist_ok=True)
    with open_job_file(launch.log, append=True) as log:
        log.write(header(launch, what))
        log.flush()
        # The job user (when the executor switches users): its uid, its primary
        # group and no other group, so it keeps none of the executor's groups.
        who: dict[str, Any] = {}
        if launch.uid is not None:
            who = {"user": launch.uid, "group": launch.gid, "extra_groups": []}
        try:
            # Never a shell: the argv is the job's, argument for argument. The
            # first rank leads a new group (0: its own pid); the others join it.
            proc = subprocess.Popen(list(launch.argv), cwd=launch.cwd, env=launch.env,
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, close_fds=True,
                                    process_group=0 if pgid is None else pgid, **who)
        except OSError as e:
            log.write(f"==== cannot start: {e}\n".encode())
            raise LaunchError(str(e)) from e
    if launch.cpus:
        try:
            os.sched_setaffinity(proc.pid, launch.cpus)
        except OSError as e:  # the process may have exited already; say so in its log
            with open_job_file(launch.log, append=True) as log:
                log.write(f"==== cannot pin to cores {list(launch.cpus)}: {e}\n".encode())
    return proc


def start_ranks(launches: Sequence[RankLaunch], what: str) -> tuple[list[ChildRank], int]:
    """Start every process of ``launches`` in one new process group; the
    ranks and the group id. If one cannot start, those started are killed
    and the error is raised (:class:`LaunchError` when the program cannot run)."""
    ranks: list[ChildRank] = []
    pgid: int | None = None
    try:
        for launch in launches:
            proc = _start_one(launch, what, pgid)
            pgid = proc.pid if pgid is None else pgid
            ranks.append(ChildRank(launch.local_rank, proc))
    except BaseException:
        if pgid is not None:
            signal_group(pgid, signal.SIGKILL)
        for r in ranks:
            r.proc.wait()
        raise
    assert pgid is not None
    return ranks, pgid


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # the group's id went to someone else's processes
        return False
    return True


def kill_stragglers(pgid: int) -> None:
    """SIGKILL what is left of a job's group once its ranks ended (a rank's
    own children that outlived it)."""
    with contextlib.suppress(OSError):
        signal_group(pgid, signal.SIGKILL)
