"""The Slurm client a Slurm backend drives (issue 37): submit a Hops job's
start on exactly the planned node, with the planned GPUs and cores, in the
partition Hops owns; stop it with SIGTERM, then a kill after its grace; read
back jobs and nodes.

Which channel does what (docs/slurm.md, "Which operation goes where"):

* submit: the CLI (``sbatch --parsable``): REST v0.0.38 cannot pin a node
  (``required_nodes`` is disabled there);
* signal, kill, read jobs and nodes: slurmrestd when it is configured,
  else the CLI (``scancel --full``, ``squeue --json``, ``sinfo --json``,
  which write the same schema as REST).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shlex
import time
from collections.abc import Callable

import msgspec

from executor.slurm import cli
from executor.slurm.cli import SlurmFailure
from executor.slurm.records import (
    SlurmJob,
    SlurmNode,
    decode_jobs,
    decode_nodes,
    parse_scontrol_job,
)
from executor.slurm.rest import SlurmRest
from shared.slurm import SLURM_STOP_TIMEOUT, holds_node, job_name

# slurmctld answers in well under a second; a Slurm command retries an
# unreachable slurmctld for about MessageTimeout (10 s by default) before it
# gives up by itself.
DEFAULT_TIMEOUT_S = 10.0
# A stop reads its one job at these intervals (seconds), doubling: most jobs
# end within a tenth of a second of their SIGTERM (docs/slurm.md, "Measured").
STOP_POLL_FIRST_S = 0.02
STOP_POLL_MAX_S = 0.5


class SlurmClusterSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach a Slurm cluster. ``user``: the Slurm user Hops acts as
    ('' for this process's own); a root process submits for it with
    ``--uid``. ``rest_url``: slurmrestd ('' to use the CLI alone).
    ``slurm_conf``: '' for Slurm's own choice, as its commands make it.
    ``timeout_s``: the most any one Slurm call (a command, a REST request)
    may take, and the longest a start or stop waits for a reading of
    Slurm (``HOPS_SLURM_TIMEOUT_S``)."""

    slurm_conf: str
    partition: str = "hops"
    user: str = ""
    rest_url: str = ""
    token_lifespan_s: int = 3600
    timeout_s: float = DEFAULT_TIMEOUT_S


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One start of a Hops job on one node: ``command`` runs (exec'd by the
    batch script, so Slurm's signals reach it directly) in ``workdir`` with
    ``env`` (and Slurm's own variables, ``CUDA_VISIBLE_DEVICES`` among
    them), its output to ``output``. No Slurm time limit: a job's
    ``time_limit`` is Hops' own (:mod:`scheduling.live.timelimit`), which
    stops it with a checkpoint; Slurm's would end it ``TIMEOUT``, a failure
    outside Hops."""

    job_id: str
    attempt: int
    node: str
    gpus: int
    cores: int
    command: list[str]
    workdir: str
    env: dict[str, str] = {}
    output: str = "/dev/null"

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("a job request needs a command")
        if self.gpus < 0 or self.cores < 1:
            raise ValueError(f"gpus must be >= 0 and cores >= 1, got {self.gpus}, {self.cores}")


def batch_script(command: list[str]) -> bytes:
    """The batch script of ``command``: it execs it, so the job's process is
    the one Slurm signals."""
    return f"#!/bin/sh\nexec {shlex.join(command)}\n".encode()


def sbatch_argv(req: JobRequest, settings: SlurmClusterSettings, *, as_uid: bool,
                gid: int | None = None) -> list[str]:
    """``sbatch``'s arguments for ``req``: the one planned node, its GPUs and
    cores, Hops' partition, a name Hops finds again, and no requeue by Slurm
    (Hops requeues, from the job's progress)."""
    argv = [
        "sbatch", "--parsable", f"--partition={settings.partition}",
        f"--job-name={job_name(req.job_id, req.attempt)}",
        f"--nodelist={req.node}", "--nodes=1", "--ntasks=1",
        f"--cpus-per-task={req.cores}", f"--chdir={req.workdir}",
        f"--output={req.output}", "--export=ALL", "--no-requeue",
    ]
    if req.gpus:
        argv.append(f"--gres=gpu:{req.gpus}")
    if as_uid and settings.user:
        argv.append(f"--uid={settings.user}")
        if gid is not None:  # else the job's group is root's
            argv.append(f"--gid={gid}")
    return argv


class SlurmClient:
    """One Slurm cluster, as :class:`SlurmClusterSettings` names it."""

    def __init__(self, settings: SlurmClusterSettings) -> None:
        self.settings = settings
        self._env = cli.command_env(settings.slurm_conf)
        self.rest: SlurmRest | None = None
        if settings.rest_url:
            self.rest = SlurmRest(settings.rest_url, settings.user or _whoami(), self.token,
                                  lifespan_s=settings.token_lifespan_s,
                                  timeout_s=settings.timeout_s)

    async def aclose(self) -> None:
        if self.rest is not None:
            await self.rest.aclose()

    async def _cli(self, *argv: str, stdin: bytes | None = None, env: dict[str, str] | None = None
                   ) -> bytes:
        return await cli.run(list(argv), env or self._env, stdin=stdin,
                             timeout_s=self.settings.timeout_s)

    async def token(self, lifespan_s: int) -> str:
        """A JWT for the settings' user from slurmctld (``scontrol token``)."""
        argv = ["scontrol", "token", f"lifespan={lifespan_s}"]
        if self.settings.user:
            argv.insert(2, f"username={self.settings.user}")
        out = (await self._cli(*argv)).decode().strip()
        if not out.startswith("SLURM_JWT="):
            raise SlurmFailure("slurm_bad_answer", f"scontrol token wrote {out[:80]!r}")
        return out.removeprefix("SLURM_JWT=")

    async def submit(self, req: JobRequest) -> int:
        """Submits ``req``; its Slurm job id."""
        as_uid = os.geteuid() == 0
        gid = pwd.getpwnam(self.settings.user).pw_gid if as_uid and self.settings.user else None
        argv = sbatch_argv(req, self.settings, as_uid=as_uid, gid=gid)
        env = cli.command_env(self.settings.slurm_conf, req.env)
        out = (await self._cli(*argv, stdin=batch_script(req.command), env=env)).decode()
        head = out.strip().split(";")[0]
        if not head.isdigit():
            raise SlurmFailure("slurm_bad_answer", f"sbatch --parsable wrote {out[:80]!r}")
        return int(head)

    async def signal(self, job_id: int, signal: str = "TERM") -> None:
        """Sends ``signal`` to the job's processes, batch script included
        (``scancel --signal`` without ``--full`` spares the batch script)."""
        if self.rest is not None:
            await self.rest.signal(job_id, signal)
        else:
            await self._cli("scancel", "--full", f"--signal={signal}", str(job_id))

    async def cancel(self, job_id: int) -> None:
        """Ends the job at once, pending or running (Slurm's cancel)."""
        if self.rest is not None:
            await self.rest.cancel(job_id)
        else:
            await self._cli("scancel", str(job_id))

    async def stop(self, job_id: int, grace_s: float,
                   mine: Callable[[SlurmJob], bool]) -> SlurmJob | None:
        """A Hops stop: SIGTERM (the job checkpoints), then SIGKILL if it
        still runs ``grace_s`` later; a job still pending is cancelled. The
        job as last read (None: slurmctld no longer knows it, or the id now
        names a job that ``mine`` says is not the one to stop: a slurmctld
        restarted without its last jobs gives their ids again, so every
        reading is checked before a signal is sent). It reads the
        one job, at intervals that double from :data:`STOP_POLL_FIRST_S` to
        :data:`STOP_POLL_MAX_S`; a job that still holds its node
        ``timeout_s`` after the SIGKILL is
        :data:`shared.slurm.SLURM_STOP_TIMEOUT`."""
        job = _only(await self.job(job_id), mine)
        if job is None or not _holds(job):
            return job
        if job.verdict().kind == "waiting":
            await self.cancel(job_id)
        else:
            await self._signal_unless_ended(job_id, "TERM", mine)
        deadline, killed = time.monotonic() + grace_s, False
        poll = STOP_POLL_FIRST_S
        while (job := _only(await self.job(job_id), mine)) is not None and _holds(job):
            if time.monotonic() >= deadline and killed:
                raise SlurmFailure(SLURM_STOP_TIMEOUT, f"Slurm job {job_id} still {job.job_state} "
                                   f"{self.settings.timeout_s:g} s after its SIGKILL")
            if time.monotonic() >= deadline:
                await self._signal_unless_ended(job_id, "KILL", mine)
                deadline, killed = time.monotonic() + self.settings.timeout_s, True
            await asyncio.sleep(poll)
            poll = min(2 * poll, STOP_POLL_MAX_S)
        return job

    async def _signal_unless_ended(self, job_id: int, signal: str,
                                   mine: Callable[[SlurmJob], bool]) -> None:
        """:meth:`signal`, where a job that ended meanwhile is no failure."""
        try:
            await self.signal(job_id, signal)
        except SlurmFailure:
            job = _only(await self.job(job_id), mine)
            if job is not None and _holds(job):
                raise

    async def jobs(self) -> list[SlurmJob]:
        """The jobs of Hops' partition slurmctld still knows (running ones,
        and ended ones for ``MinJobAge`` seconds)."""
        if self.rest is not None:
            jobs = await self.rest.jobs()
        else:
            # squeue --json ignores its filters in 22.05: every job comes back.
            jobs, errors = decode_jobs(await self._cli("squeue", "--json"))
            if errors and not jobs:
                raise SlurmFailure("slurm_cli_failed", f"squeue --json: {errors[0].error}")
        return [j for j in jobs if j.partition == self.settings.partition]

    async def job(self, job_id: int) -> SlurmJob | None:
        """Slurm job ``job_id``, read alone (``scontrol show job -d`` or REST's
        ``/job/<id>``); None once slurmctld has forgotten it, or when it is
        not in Hops' partition."""
        if self.rest is not None:
            jobs = await self.rest.job(job_id)
        else:
            try:
                out = await self._cli("scontrol", "show", "job", "-d", "-o", str(job_id))
            except SlurmFailure as e:
                if "invalid job id" in e.error.lower():  # forgotten (MinJobAge), or never
                    return None
                raise
            one = parse_scontrol_job(out.decode(errors="replace"))
            jobs = [one] if one is not None else []
        return next((j for j in jobs if j.job_id == job_id
                     and j.partition == self.settings.partition), None)

    async def nodes(self) -> list[SlurmNode]:
        """The nodes of Hops' partition."""
        if self.rest is not None:
            nodes = await self.rest.nodes()
        else:
            nodes, errors = decode_nodes(await self._cli("sinfo", "--json"))
            if errors and not nodes:
                raise SlurmFailure("slurm_cli_failed", f"sinfo --json: {errors[0].error}")
        return [n for n in nodes if self.settings.partition in n.partitions]


def _only(job: SlurmJob | None, mine: Callable[[SlurmJob], bool]) -> SlurmJob | None:
    """``job`` if it is the one a stop is for, else None (as if gone)."""
    return job if job is not None and mine(job) else None


def _holds(job: SlurmJob) -> bool:
    """Whether the job still holds its node (:func:`shared.slurm.holds_node`)."""
    return holds_node(job.verdict())


def _whoami() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name
