"""What produced a result: the commit and the versions that move numbers.

Recorded in every ``summary.json`` and ``results.json`` (docs/results.md,
"Reproducible results"): the same command gives the same numbers only with
the same commit, Python, HiGHS and numpy. The constraints file at the repo
root (``constraints.txt``) pins them for ``make``.
"""

from __future__ import annotations

import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository the package runs from
PACKAGES = ("highspy", "numpy", "msgspec")
GIT_TIMEOUT_S = 5.0


def provenance() -> dict[str, str]:
    """The commit, Python, the solver's and numpy's versions and the platform."""
    info = {"commit": commit(), "python": platform.python_version()}
    info.update({name: installed(name) for name in PACKAGES})
    info["platform"] = platform.platform()
    return info


def installed(name: str) -> str:
    """The installed version of distribution ``name``, or ``"not installed"``."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def commit(root: Path = ROOT) -> str:
    """``git rev-parse HEAD`` of ``root``, with ``+dirty`` when tracked files
    differ from it; ``"unknown"`` when ``root`` is no checkout's top (an
    install in site-packages) or git is missing."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return "unknown"
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        return "unknown"
    changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    # A status git cannot give counts as dirty: the commit alone may not be the code.
    return head if changes == "" else f"{head}+dirty"


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
