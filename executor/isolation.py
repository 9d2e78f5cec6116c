"""Who a real job runs as, and what it inherits (docs/security.md, *Jobs*).

A job's command is someone else's code. The executor therefore runs it:

* as the **job user** (``--job-user``/``HOPS_JOB_USER``): when the executor
  is root, every process of the job is started with that user's uid and
  primary gid and no supplementary groups. An executor that is root with no
  job user (or the job user root) refuses to run jobs unless
  ``--allow-root-jobs``/``HOPS_ALLOW_ROOT_JOBS=1`` says so explicitly. An
  executor that is not root cannot switch users: its jobs run as itself;
* in a **clean environment**: only the variables of :data:`PASSED` (and
  those starting with :data:`PASSED_PREFIXES`) come from the executor's
  environment, never one starting with ``HOPS_`` (:func:`base_env`). The
  launch then adds ``HOME`` (the job's run folder), the job's own ``env``
  and the executor's job variables (:mod:`executor.launch`);
* in a **run folder of its own**, owned by the job user, mode 0700
  (:func:`prepare_folders`).

Everything here is pure but :func:`lookup_user`, :func:`unreachable` and
:func:`prepare_folders`, which read or change the file system and the user
database.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# What a job may inherit from the executor: the program search path, the
# locale and time zone, the import path of the hops plugin (and unbuffered
# output, so its log shows lines as they are printed), and the variables
# that locate CUDA and configure NCCL/Gloo on the host.
PASSED: frozenset[str] = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONUNBUFFERED", "LD_LIBRARY_PATH",
    "CUDA_HOME",
})
PASSED_PREFIXES: tuple[str, ...] = ("LC_", "NCCL_", "GLOO_")
# Never inherited, whatever the lists above say: the system's own settings
# and credentials (HOPS_NATS_*, HOPS_TOKEN, HOPS_TENANTS, HOPS_GATEWAY_*...).
SYSTEM_PREFIX = "HOPS_"


def passes(name: str) -> bool:
    """Whether the executor's variable ``name`` reaches a job."""
    if name.startswith(SYSTEM_PREFIX):
        return False
    return name in PASSED or name.startswith(PASSED_PREFIXES)


def base_env(executor_env: Mapping[str, str], home: str, user: str = "") -> dict[str, str]:
    """What a job inherits of ``executor_env``, with ``HOME`` (its run
    folder) and, when known, ``USER``/``LOGNAME`` (the job user)."""
    env = {k: v for k, v in executor_env.items() if passes(k)}
    env["HOME"] = home
    if user:
        env["USER"] = env["LOGNAME"] = user
    return env


class JobUserError(ValueError):
    """The job user cannot be used (unknown, or root without permission)."""


@dataclass(frozen=True)
class JobIdentity:
    """Who a real job's processes run as. ``switch``: the executor is root
    and starts them with ``uid``/``gid``; otherwise they run as the executor."""

    name: str
    uid: int
    gid: int
    switch: bool = False
    allow_root: bool = False
    note: str = ""  # what the executor logs about it at start

    def refusal(self) -> str | None:
        """Why no job may run as this identity, or None."""
        if self.uid == 0 and not self.allow_root:
            return ("refusing to run jobs as root: the executor runs as root and no "
                    "unprivileged job user is configured; set --job-user USER "
                    "(HOPS_JOB_USER), or --allow-root-jobs (HOPS_ALLOW_ROOT_JOBS=1) to "
                    "run jobs as root on purpose")
        return None


def root_refusal(ident: JobIdentity, euid: int) -> str | None:
    """Why an executor running as ``euid`` must not start a job as
    ``ident``: the check before every start, whatever the executor's start
    checked (an identity that would not switch users runs jobs as root)."""
    why = ident.refusal()
    if why is None and euid == 0 and not ident.switch and not ident.allow_root:
        return JobIdentity(ident.name, 0, ident.gid).refusal()
    return why


@dataclass(frozen=True)
class UserEntry:
    """What the executor needs of a user database entry."""

    name: str
    uid: int
    gid: int


Lookup = Callable[[str], UserEntry | None]  # by name or numeric id; None: no such user


def resolve_identity(wanted: str, allow_root: bool, euid: int, egid: int,
                     lookup: Lookup) -> JobIdentity:
    """The identity of the jobs of an executor running as ``euid``/``egid``
    that was asked for job user ``wanted`` ('' for none).
    :class:`JobUserError` when ``wanted`` names no user."""
    entry = lookup(wanted) if wanted else None
    if wanted and entry is None:
        raise JobUserError(f"job user {wanted!r} does not exist on this host")
    me = lookup(str(euid))
    my_name = me.name if me is not None else str(euid)
    if euid != 0:
        note = f"the executor is not root: jobs run as its own user {my_name}"
        if entry is not None and entry.uid != euid:
            note += f" (job user {entry.name} ignored: switching users needs root)"
        return JobIdentity(my_name, euid, egid, allow_root=allow_root, note=note)
    if entry is None or entry.uid == 0:  # root jobs: refusal() says whether they may run
        name, gid = (entry.name, entry.gid) if entry else (my_name, egid)
        note = "jobs run as root (allowed by --allow-root-jobs)" if allow_root else ""
        return JobIdentity(name, 0, gid, allow_root=allow_root, note=note)
    return JobIdentity(entry.name, entry.uid, entry.gid, switch=True, allow_root=allow_root,
                       note=f"jobs run as {entry.name} (uid {entry.uid}, gid {entry.gid})")


def lookup_user(name: str) -> UserEntry | None:
    """The user database's entry for a name or a numeric id."""
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        return None
    return UserEntry(pw.pw_name, pw.pw_uid, pw.pw_gid)


def traversable(mode: int, owner: int, group: int, uid: int, gid: int) -> bool:
    """Whether user ``uid`` (primary group ``gid``, no other groups) may
    pass through a folder of ``mode`` owned by ``owner``:``group``."""
    if uid == 0:
        return True
    if owner == uid:
        return bool(mode & stat.S_IXUSR)
    if group == gid:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def unreachable(path: Path, uid: int, gid: int) -> Path | None:
    """The first folder from ``/`` down to ``path`` (which exists) that the
    job user cannot pass through, or None."""
    for folder in (*reversed(path.parents), path):
        st = folder.stat()
        if not traversable(st.st_mode, st.st_uid, st.st_gid, uid, gid):
            return folder
    return None


class FolderError(OSError):
    """A job's run folder is not a plain folder (e.g. a symbolic link the
    job left there): the executor writes nothing through it."""


def prepare_folders(root: Path, folders: Iterable[Path], files: Iterable[Path],
                    ident: JobIdentity) -> None:
    """Create the job's run folder ``root`` and ``folders`` under it, mode
    0700, and give them and the existing ``files`` to the job user (when the
    executor switches users). Each is opened without following a symbolic
    link and changed through its descriptor: a job owns its folder, and a
    job of the same user could otherwise swap a link in at the right moment
    to point the executor, which is root, at any file of the host."""
    root.parent.mkdir(parents=True, exist_ok=True)  # the executor's run folder
    for folder in (root, *folders):
        fd = _open_folder(folder)
        try:
            if ident.switch:
                os.fchown(fd, ident.uid, ident.gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    if not ident.switch:
        return
    for file in files:
        try:
            with open_job_file(file) as f:
                os.fchown(f.fileno(), ident.uid, ident.gid)
        except FileNotFoundError:
            continue


def _open_folder(folder: Path) -> int:
    """A descriptor of ``folder``, created if need be; :class:`FolderError`
    if it is a link or not a folder."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(folder, flags)
        except FileNotFoundError:
            folder.mkdir(mode=0o700)
            return os.open(folder, flags)
    except (FileExistsError, NotADirectoryError) as e:
        raise FolderError(f"{folder} is not a folder (a link or a file); remove it") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FolderError(f"{folder} is a symbolic link; remove it") from e
        raise


def open_job_file(path: Path, append: bool = False) -> BinaryIO:
    """``path``, a file in a job's folder, opened by the executor for reading
    (or appending, created if need be) without following a symbolic link
    and without blocking on a FIFO: the job owns the folder and may have put
    either there to make the executor read or write another file.
    :class:`FolderError` when it is not a plain file."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= (os.O_WRONLY | os.O_APPEND | os.O_CREAT) if append else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FolderError(f"{path} is a symbolic link; remove it") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FolderError(f"{path} is not a plain file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab" if append else "rb")
