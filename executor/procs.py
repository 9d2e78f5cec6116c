"""Finding the EMULATED job processes of a job on this machine (Linux
``/proc``), by the command line ``python -m executor.job --job-id ID --role R``
that :mod:`executor.service` gives them. Fault-injection tests and the
release benchmark use it to SIGKILL a job's process."""

from __future__ import annotations

from pathlib import Path


def _flag(argv: list[str], name: str) -> str | None:
    i = argv.index(name) if name in argv else -1
    return argv[i + 1] if 0 <= i < len(argv) - 1 else None


def emulated_job_pids(job_id: str, role: str = "", proc: Path = Path("/proc")) -> list[int]:
    """PIDs of ``job_id``'s emulated job processes (of ``role`` when given)."""
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "executor.job" not in argv or _flag(argv, "--job-id") != job_id:
            continue
        if not role or _flag(argv, "--role") == role:
            out.append(int(entry.name))
    return sorted(out)
