"""The SLURM backend: a node executor's starts become Slurm batch jobs on
exactly that node (the server id is the Slurm node's name), with the
planned GPU count (``--gres=gpu:N``) and CPU cores (``--cpus-per-task``,
CODA's cores, at least one), in the partition Hops owns.

Each start gets a folder of its own under the job's run folder,
``<run>/<job>/slurm-<server>/``, owned by the Slurm user (the bridge as
root submits for it): the ``start_job`` command, the node's NATS seed the
job reports with (the node-scoped identity an executor's job always has:
a job reports only for its own node), its cores file, Slurm's output, and
``record.json`` (the Slurm job id), which is how a restarted bridge finds
its jobs again (:meth:`SlurmBackend.recover`):

* a record whose Slurm job Slurm still knows is adopted, running or ended
  (an end met while the bridge was away is then judged as any other);
* a record whose job Slurm no longer knows is lost: the node lists it and
  the monitor requeues the job from its progress.

A start on a node Slurm has drained is refused (``slurm_node_drained``), as
is one on a node Slurm reads dead (``slurm_node_down``) or does not list in
the partition (``slurm_no_node``), before any sbatch
(:func:`shared.slurm_nodes.node_refusal`). The node's heartbeats stop
while Slurm says it is dead (:attr:`alive`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from structlog.typing import FilteringBoundLogger

from executor.backend import CommandRefused, JobHandle, LostJobs, OnEnding, Refusal
from executor.emulated import write_count
from executor.emulator import EmulationError, UnknownModel, check_runnable, role_of
from executor.launch import cores_of, job_paths, relaxed_refusal
from executor.slurm.cli import CLI_TIMEOUT, SlurmFailure
from executor.slurm.client import JobRequest, SlurmClient
from executor.slurm.handle import SlurmJobHandle
from executor.slurm.realjobs import RealJobs, SlurmRealHandle, report_offset, write_launches
from executor.slurm.settings import BridgeSettings
from executor.slurm.watch import SlurmWatch
from shared import jobenv
from shared.cluster import Server
from shared.events import INVALID, StartJob, decode_command, encode
from shared.ids import JobId
from shared.slurm import failure_code, job_name
from shared.slurm_nodes import node_refusal
from world.catalog import builtin_catalog
from world.truth import GroundTruth

_RECORD = "record.json"


class StartRecord(msgspec.Struct, frozen=True):
    """What a restarted bridge needs of one start: its Slurm job and when
    it was submitted."""

    slurm_id: int
    submitted_at: float
    report_offset: int = 0  # a real job's: where this start's report lines begin


class JobEnv(msgspec.Struct, frozen=True):
    """What every job's process gets besides its own files: where NATS is,
    the jobs' flags (time scale, cadences), the cluster file and the
    node's seed file to copy."""

    nats_url: str
    job_args: list[str]
    cluster: str
    seed: str = ""  # the node's nkey seed ('': no authentication)
    ca: str = ""


class SlurmBackend:
    """Runs one node's starts in Slurm (see the module docstring)."""

    name = "slurm"

    def __init__(self, server: Server, settings: BridgeSettings, client: SlurmClient,
                 watch: SlurmWatch, job_env: JobEnv, truth: GroundTruth,
                 log: FilteringBoundLogger, real: RealJobs | None = None) -> None:
        self.server = server
        self.settings = settings
        self.client = client
        self.watch = watch
        self.job_env = job_env
        self.truth = truth
        self.log = log
        # Real jobs (their own command, executor.slurm.realjobs) or emulated ones.
        self.real = real
        self.models = () if real else tuple(sorted(builtin_catalog()))
        self._lost = LostJobs()
        self._owner = _owner(settings.slurm.user)

    @property
    def alive(self) -> bool:
        """Whether Slurm counts the node in (see :class:`SlurmWatch`)."""
        return self.watch.node_alive(self.server.id)

    def check(self, cmd: StartJob) -> Refusal | None:
        node = self.watch.nodes.get(self.server.id)
        why = node_refusal(self.server.id, self.settings.slurm.partition, self.watch.read_at,
                           node.health if node is not None else None)
        if why is not None:
            return Refusal(*why)
        if self.real is not None:
            return real_refusal(cmd)
        if cmd.spec.kind == "cpu":
            return None
        try:
            check_runnable(self.truth, cmd.spec.model, self.server.id)
        except EmulationError as e:
            return Refusal(INVALID, str(e), fail_job=isinstance(e, UnknownModel))
        return None

    def folder(self, job_id: str) -> Path:
        return job_paths(self.settings.run_dir, job_id, self.server.id).root \
            / f"slurm-{self.server.id}"

    def _prepare(self, cmd: StartJob) -> Path:
        """The start's folder, fresh, owned by the Slurm user, holding the
        command and the node's seed (both readable by that user alone)."""
        folder = self.folder(cmd.job_id)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, mode=0o700)
        paths = job_paths(self.settings.run_dir, cmd.job_id, self.server.id)
        # A real job writes its logs, reports and checkpoint (shared by its
        # starts on every node) in the job's folder.
        shared = (paths.logs, paths.checkpoint, paths.report.parent) if self.real else \
            (paths.logs,)
        for path in shared:
            path.mkdir(parents=True, exist_ok=True)
        if self.real is not None:  # its HOME, and its cores file (HOPS_CORES_FILE)
            write_count(paths.cores, cores_of(cmd))
            shared = (paths.root, paths.cores, *shared)
        (folder / "start.json").write_bytes(encode(cmd))
        if self.job_env.seed and self.real is None:  # a real job holds no credential;
            # an emulated one connects as the node (the seed's name is its identity)
            seed = folder / Path(self.job_env.seed).name
            seed.write_bytes(Path(self.job_env.seed).read_bytes())
            seed.chmod(0o600)
        write_count(folder / "cores", cores_of(cmd))
        if self._owner is not None:
            for path in (folder, *shared, *folder.iterdir()):
                os.chown(path, *self._owner)
        return folder

    def _request(self, cmd: StartJob, folder: Path) -> JobRequest:
        role = role_of(cmd.mode, cmd.configuration, self.server.id)
        e = self.job_env
        paths = job_paths(self.settings.run_dir, cmd.job_id, self.server.id)
        if self.real is not None:
            command = [self.settings.python, "-m", "executor.slurm.runner",
                       str(write_launches(cmd, paths, folder, self.real))]
        else:
            command = [self.settings.python, "-m", "executor.job", "--job-id", cmd.job_id,
                       "--role", role, "--cluster", e.cluster, "--command-file",
                       str(folder / "start.json"), "--log-file", str(paths.log(0)),
                       *e.job_args]
        env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": jobs_pythonpath(self.settings),
               jobenv.CORES: str(cores_of(cmd)), jobenv.CORES_FILE: str(folder / "cores")}
        if self.real is None:
            env["HOPS_NATS_URL"] = e.nats_url
        if e.seed and self.real is None:
            env["HOPS_NATS_NKEY"] = str(folder / Path(e.seed).name)
        if e.ca and self.real is None:
            env["HOPS_NATS_CA"] = e.ca
        return JobRequest(job_id=cmd.job_id, attempt=int(time.time() * 1000),
                          node=self.server.id, gpus=len(cmd.gpu_indices),
                          cores=max(1, cores_of(cmd)), command=command, workdir=str(folder),
                          env=env, output=str(folder / "output"))

    async def spawn(self, cmd: StartJob, on_ending: OnEnding,
                    cores: tuple[int, ...] = ()) -> JobHandle:
        folder = self._prepare(cmd)
        offset = report_offset(job_paths(self.settings.run_dir, cmd.job_id, self.server.id))
        slurm_id = await self._submit(self._request(cmd, folder))
        # Once sbatch has returned, slurmctld holds the job: a reading begun
        # after this shows it, one begun before may not (one begun while
        # sbatch ran read it gone, and its job ran twice).
        submitted = time.time()
        (folder / _RECORD).write_bytes(msgspec.json.encode(StartRecord(slurm_id, submitted,
                                                                           offset)))
        self._lost.clear(cmd.job_id)
        log = self.log.bind(job_id=cmd.job_id)
        log.info("Slurm job submitted", slurm_job=slurm_id, mode=cmd.mode,
                 gpus=len(cmd.gpu_indices), cores=max(1, cores_of(cmd)))
        return self._handle(cmd, slurm_id, submitted, folder, on_ending, offset)

    async def _submit(self, req: JobRequest) -> int:
        """``req`` submitted; a Slurm that refuses it or does not answer is
        the start's refusal (``slurm_refused``, ``slurm_unavailable``, with
        Slurm's words), never the job's failure: it may run once Slurm
        answers. An sbatch that timed out may still have submitted the job:
        the watch cancels any job of its name it finds (:mod:`executor.slurm.strays`)."""
        try:
            return await self.client.submit(req)
        except SlurmFailure as e:
            code = failure_code(e.code, e.error)
            if e.code == CLI_TIMEOUT:
                self.watch.strays.add_name(job_name(req.job_id, req.attempt), time.time())
            self.log.warning("Slurm did not take the start", job_id=req.job_id, code=code,
                             error=e.error)
            raise CommandRefused(code, f"Slurm did not take job {req.job_id} on "
                                 f"{req.node}: {e.error}") from e

    def _handle(self, cmd: StartJob, slurm_id: int, submitted: float, folder: Path,
                on_ending: OnEnding, offset: int = 0) -> SlurmJobHandle:
        paths = job_paths(self.settings.run_dir, cmd.job_id, self.server.id)
        args = (cmd, slurm_id, folder / "output", submitted, self.watch, self.client,
                self.log.bind(job_id=cmd.job_id), on_ending,
                lambda: self._lost.mark(cmd.job_id),
                folder / "cores" if self.real is None else paths.cores)
        if self.real is None:
            return SlurmJobHandle(*args)
        return SlurmRealHandle(*args, paths=paths, real=self.real, offset=offset)

    async def recover(self, on_ending: Callable[[JobId], OnEnding]) -> list[JobHandle]:
        """The starts recorded here: adopted where Slurm knows them, lost where not."""
        await self.watch.read()
        adopted: list[JobHandle] = []
        for record_file in sorted(self.settings.run_dir.glob(f"*/slurm-{self.server.id}/"
                                                             f"{_RECORD}")):
            folder = record_file.parent
            try:
                rec = msgspec.json.decode(record_file.read_bytes(), type=StartRecord)
                cmd = decode_command((folder / "start.json").read_bytes())
            except (OSError, msgspec.DecodeError, ValueError) as e:
                self.log.warning("unreadable start record", folder=str(folder), error=str(e))
                continue
            if not isinstance(cmd, StartJob):
                continue
            handle = self._handle(cmd, rec.slurm_id, rec.submitted_at, folder,
                                  on_ending(cmd.job_id), rec.report_offset)
            if (job := handle.state()) is None:  # unknown, or its id now another's
                self.log.warning("Slurm no longer knows a job Hops ran here: lost",
                                 job_id=cmd.job_id, slurm_job=rec.slurm_id)
                self._lost.mark(cmd.job_id)
                record_file.unlink(missing_ok=True)
                continue
            handle.read_output()
            self.log.info("Slurm job adopted", job_id=cmd.job_id, slurm_job=rec.slurm_id,
                          state=job.job_state,
                          samples_done=handle.samples_done)
            adopted.append(handle)
        return adopted

    def lost(self) -> tuple[JobId, ...]:
        return self._lost.listed()

    def forget(self, job: JobHandle) -> None:
        """The start ended or was stopped: its record goes (its output stays),
        unless a later start of the job on this node wrote its own since."""
        record = self.folder(job.cmd.job_id) / _RECORD
        try:
            rec = msgspec.json.decode(record.read_bytes(), type=StartRecord)
        except (OSError, msgspec.DecodeError):
            return
        if isinstance(job, SlurmJobHandle) and rec.slurm_id == job.slurm_id:
            record.unlink(missing_ok=True)

    async def tick(self) -> None:
        pass

    async def close(self) -> None:
        pass


def real_refusal(cmd: StartJob) -> Refusal | None:
    """Why a real job cannot start at all (as :class:`executor.real.RealBackend`)."""
    if not cmd.spec.command:
        return Refusal(INVALID, f"job {cmd.job_id} has no command; the Slurm bridge runs "
                                "real jobs", fail_job=True)
    if (why := relaxed_refusal(cmd)) is not None:
        return Refusal(INVALID, why)
    return None


def _owner(user: str) -> tuple[int, int] | None:
    """(uid, gid) the start folders belong to: the Slurm user when the
    bridge runs as root and submits for it; None otherwise."""
    if os.geteuid() != 0 or not user:
        return None
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def jobs_pythonpath(settings: BridgeSettings) -> str:
    """The jobs' ``PYTHONPATH``: Hops' packages and ``HOPS_SLURM_PYTHONPATH``."""
    return ":".join(p for p in (_source_root(), settings.pythonpath) if p)


def _source_root() -> str:
    """The folder holding Hops' packages (the job runs ``executor.job``)."""
    return str(Path(__file__).resolve().parents[2])
