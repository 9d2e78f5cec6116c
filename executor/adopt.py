"""What a real executor keeps across its own restart.

Real job processes run in a process group of their own, so they outlive
the executor that started them (:mod:`executor.ranks`). The executor keeps a state file,
``<run-dir>/executor-<server>.json``, listing every job it launched and has
not seen end: the ``start_job`` command, each process's pid with its start
time (field 22 of ``/proc/<pid>/stat``, in clock ticks since boot: a pid
the kernel gave to another process since has another start time), the
process group, and how far the report file was read. The file is written
whole to a temporary file and renamed over the old one, so a crash leaves
the old state or the new one, never half of one.

When the executor starts again, each job whose processes all still run is
adopted; any other is gone (:func:`triage`). Reading ``/proc`` is the only
I/O besides the state file itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from shared.events import StartJob
from shared.ids import ServerId

_DEAD_STATES = frozenset("ZXx")  # zombie or dead: the process ran its course


class RankRecord(msgspec.Struct, frozen=True):
    """One process of a job: its local rank, pid and start time."""

    local_rank: int
    pid: int
    start_time: int


class LaunchRecord(msgspec.Struct, frozen=True):
    """One launched job, as the state file keeps it."""

    cmd: StartJob
    pgid: int
    ranks: tuple[RankRecord, ...]
    report_file: str
    logs: tuple[str, ...]
    offset: int = 0
    samples_done: float = 0.0
    finished: bool = False
    profiled: bool = False
    cores: tuple[int, ...] = ()  # the core ids its threads are pinned to (executor.pinning)


class ExecutorState(msgspec.Struct, frozen=True):
    """The whole state file of one server's executor."""

    server_id: ServerId
    jobs: tuple[LaunchRecord, ...] = ()
    v: int = 1


class StateError(ValueError):
    """A state file that cannot be read."""


def state_path(run_dir: Path, server: str) -> Path:
    return run_dir / f"executor-{server}.json"


def load_state(path: Path, server: ServerId) -> ExecutorState:
    """The state in ``path``; empty when there is none; :class:`StateError`
    when it cannot be read (the caller decides what to do with it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ExecutorState(server_id=server)
    try:
        state = msgspec.json.decode(data, type=ExecutorState)
    except (msgspec.DecodeError, ValueError) as e:
        raise StateError(f"{path}: {e}") from None
    if state.server_id != server:
        raise StateError(f"{path} is the state of {state.server_id}, not of {server}")
    return state


def save_state(path: Path, state: ExecutorState) -> None:
    """Write ``state`` atomically (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # 0600: it holds every job's command and env, which are no job's business.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(msgspec.json.encode(state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def parse_stat(text: str) -> tuple[str, int, int]:
    """``(state, process group, start time)`` from a ``/proc/<pid>/stat``
    line. The command name (field 2) may hold spaces and parentheses, so
    the fields are counted from its last closing parenthesis."""
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state), rest[2] field 5 (pgrp), rest[19] field 22 (starttime)
    return rest[0], int(rest[2]), int(rest[19])


def read_stat(pid: int, proc: Path = Path("/proc")) -> tuple[str, int, int] | None:
    """``/proc/<pid>/stat`` parsed, or None when there is no such process."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    stat = read_stat(pid, proc)
    return stat[2] if stat is not None else None


def running(pid: int, started: int, proc: Path = Path("/proc")) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs
    (not another process that got its pid, nor a zombie)."""
    stat = read_stat(pid, proc)
    return stat is not None and stat[2] == started and stat[0] not in _DEAD_STATES


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """The running processes of process group ``pgid``."""
    out = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None and stat[1] == pgid and stat[0] not in _DEAD_STATES:
                out.append(int(entry.name))
    return sorted(out)


def triage(jobs: tuple[LaunchRecord, ...], alive: Callable[[RankRecord], bool]
           ) -> tuple[list[LaunchRecord], list[LaunchRecord]]:
    """``(adopt, gone)``: jobs whose every process still runs, and the rest
    (a job missing a process cannot go on: its ranks wait for each other)."""
    adopt: list[LaunchRecord] = []
    gone: list[LaunchRecord] = []
    for job in jobs:
        (adopt if job.ranks and all(alive(r) for r in job.ranks) else gone).append(job)
    return adopt, gone
