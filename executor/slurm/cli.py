"""Slurm's command line, run as child processes (``sbatch``, ``scancel``,
``squeue``, ``sinfo``, ``scontrol``), each with a time limit."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

# Variables a Slurm command reads besides its arguments; the rest of this
# process's environment is not handed on (a job gets only what Hops gives it).
_PASSED = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")
CLI_TIMEOUT = "slurm_cli_timeout"


class SlurmFailure(Exception):
    """A Slurm operation that did not happen: ``code`` says which way
    (``slurm_cli_failed``, ``slurm_cli_timeout``, ``slurm_cli_missing``,
    ``slurm_rest_failed``, ``slurm_rest_refused``, ``slurm_rest_timeout``,
    ``slurm_rest_unreachable``, ``slurm_no_reading``, ``slurm_bad_answer``),
    ``error`` in words, with what Slurm said. A command it fails is refused
    with :func:`shared.slurm.failure_code` of it."""

    def __init__(self, code: str, error: str) -> None:
        super().__init__(f"{code}: {error}")
        self.code = code
        self.error = error


def command_env(slurm_conf: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Slurm command: the cluster's ``SLURM_CONF`` (''
    names none: the command finds its own, as it does run by hand), the
    few variables commands need, and ``extra`` (a job's environment, which
    ``sbatch --export=ALL`` hands to the job)."""
    env = {k: os.environ[k] for k in _PASSED if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    env.update(extra or {})
    return env


async def run(argv: list[str], env: Mapping[str, str], *, stdin: bytes | None = None,
              timeout_s: float = 30.0) -> bytes:
    """The standard output of ``argv``; :class:`SlurmFailure` when it cannot
    start, exits non-zero or outlives ``timeout_s``."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(env), stdin=asyncio.subprocess.PIPE if stdin is not None else None,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise SlurmFailure("slurm_cli_missing", f"{argv[0]} could not start: {e}") from e
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    except TimeoutError as e:
        proc.kill()
        await proc.wait()
        raise SlurmFailure(CLI_TIMEOUT,
                           f"{' '.join(argv[:2])} did not answer within {timeout_s:g} s") from e
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
        raise SlurmFailure("slurm_cli_failed",
                           f"{' '.join(argv[:2])} exited {proc.returncode}: {said[-500:]}")
    return out
