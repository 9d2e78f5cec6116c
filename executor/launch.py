"""How a real job's processes are launched on one node (pure: argv, paths
and environment, nothing is started here).

A ``start_job`` runs the job's ``spec.command`` once per GPU this server
holds in the configuration (one rank per GPU, data parallel), or once for a
profiling run. Each process gets the environment of :mod:`shared.jobenv`
plus PyTorch's distributed-launch variables:

* ``WORLD_SIZE`` = the configuration's GPUs, ``RANK`` = the GPUs of the
  servers before this one (configurations are sorted by server id) + the
  local rank, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` = this server's GPUs;
* ``MASTER_ADDR``/``MASTER_PORT`` from the command's rendezvous (without
  one, 127.0.0.1 and a port drawn from the command's key);
* ``CUDA_VISIBLE_DEVICES`` = every GPU index the job holds here, for every
  local rank (rank k uses ``cuda:k``);
* ``HOPS_CORES`` = the CPU cores the job holds on this server
  (:func:`cores_of`; 0: none allocated) and, when it holds some,
  ``OMP_NUM_THREADS`` = each process's share of them (at least 1), which
  the job's own ``env`` may still set; ``HOPS_CORES_FILE`` names the file
  holding the current count (:mod:`executor.pinning` rewrites it when a
  ``set_cores`` changes it). Each process starts pinned to the core ids the
  executor's ledger chose for the job (:mod:`executor.cores`), unless the
  operator gave ``--cpu-affinity``: an operator's per-device cores take
  precedence, and the executor then neither chooses nor re-pins cores.

A relaxed-sync job (``spec.sync_scale`` S > 0) running also gets
``HOPS_SYNC_SCALE`` and ``HOPS_MICRO_BATCHES`` (the start's split, else an
even one, :func:`micro_batches_of`) and ``HOPS_LR`` for S GPUs (hare.md
§2.2.3); a start placing it on more than S GPUs is refused
(:func:`relaxed_refusal`).

A profiling run is one process with ``WORLD_SIZE`` 1, and so is a CPU job
(CODA: a part with no GPUs), with ``CUDA_VISIBLE_DEVICES`` empty. A process inherits
only what :func:`executor.isolation.base_env` lets through of the
executor's environment (``PATH``, the locale, ``PYTHONPATH``..., never a
``HOPS_`` variable) plus ``HOME`` (the job's run folder); then come the
job's own ``env`` and the executor's variables last, so a job cannot
override them (:data:`shared.jobenv.RESERVED`; the spec already refuses those).

Files live in the run folder, per job: ``<run-dir>/<job>/logs/<server>-rank<k>.log``
(stdout and stderr of each process, appended across starts),
``<run-dir>/<job>/checkpoint`` (shared by every server of the job on this
host) and ``<run-dir>/<job>/reports/<server>.jsonl`` (what the job's plugin
reports, :mod:`shared.jobreport`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from executor.isolation import JobIdentity, base_env
from shared import jobenv
from shared.configuration import Configuration
from shared.events import StartJob
from shared.ids import ServerId
from shared.jobkeys import path_name
from shared.node import Rendezvous, rendezvous_port
from shared.relaxed import even_split, format_split

LOCALHOST = "127.0.0.1"


class AffinityError(ValueError):
    """A CPU affinity that cannot be used, with the reason."""


@dataclass(frozen=True)
class JobPaths:
    """The files of one job on one server, under the run folder."""

    root: Path
    server: ServerId

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def report(self) -> Path:
        return self.root / "reports" / f"{self.server}.jsonl"

    @property
    def cores(self) -> Path:
        """The job's current core count on this server (jobenv.CORES_FILE)."""
        return self.root / f"cores-{self.server}"

    def log(self, local_rank: int) -> Path:
        return self.logs / f"{self.server}-rank{local_rank}.log"


def job_paths(run_dir: Path, job_id: str, server: ServerId) -> JobPaths:
    """The job's directory: one name under ``run_dir`` (``alice.j1`` for the
    key ``alice/j1``, :func:`shared.jobkeys.path_name`), never a subdirectory
    of another job's."""
    return JobPaths(run_dir / path_name(job_id), server)


@dataclass(frozen=True)
class LaunchOptions:
    """What the executor adds to every launch: its GPU type, the report
    cadence, and for CPU devices the threads and cores of each process."""

    gpu_type: str
    sample_s: float = jobenv.DEFAULT_SAMPLE_S
    profile_iters: int = jobenv.DEFAULT_PROFILE_ITERS
    threads: int | None = None  # per process; None: leave it to the job
    affinity: tuple[tuple[int, ...], ...] = ()  # device index -> CPU cores


@dataclass(frozen=True)
class RankLaunch:
    """One process to start: its argv (never through a shell), environment,
    working folder (None: the executor's), log file, CPU cores and user."""

    local_rank: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None
    log: Path
    cpus: tuple[int, ...] = ()
    uid: int | None = None  # the job user's, when the executor switches users
    gid: int | None = None


def node_rank(configuration: Configuration, server: ServerId) -> int:
    """The index of ``server`` among the configuration's servers."""
    return configuration.servers.index(server)


def rank_offset(configuration: Configuration, server: ServerId) -> int:
    """The global rank of ``server``'s local rank 0: the GPUs before it."""
    return sum(g for _, g in configuration.parts[: node_rank(configuration, server)])


def rendezvous_of(cmd: StartJob) -> Rendezvous:
    """Where the job's processes meet: the placer's rendezvous, else this
    host on a port drawn from the key. A profiling run (one process) always
    meets itself on this host."""
    port = cmd.rendezvous.master_port if cmd.rendezvous else rendezvous_port(cmd.key)
    if cmd.rendezvous is None or cmd.mode == "profile":
        return Rendezvous(master_addr=LOCALHOST, master_port=port)
    return cmd.rendezvous


def world_of(cmd: StartJob) -> tuple[int, int, int, int]:
    """``(world size, local processes, nodes, node rank)`` of the launch."""
    if cmd.mode == "profile" or not cmd.gpu_indices:  # or a CPU job: one process
        return 1, 1, 1, 0
    config = cmd.configuration
    return (config.total_gpus, len(cmd.gpu_indices), config.num_nodes,
            node_rank(config, cmd.server_id))


def cores_of(cmd: StartJob) -> int:
    """The CPU cores ``cmd``'s job holds on its server (a profiling run: none)."""
    return cmd.configuration.demand_on(cmd.server_id).cores if cmd.mode == "run" else 0


def sync_scale_of(cmd: StartJob) -> int:
    """The sync scale ``cmd``'s processes run at (0: not relaxed; a
    profiling run and a CPU job never are)."""
    return cmd.spec.sync_scale if cmd.mode == "run" and cmd.gpu_indices else 0


def relaxed_refusal(cmd: StartJob) -> str | None:
    """Why ``cmd`` cannot run relaxed: more GPUs than micro-batches a step."""
    scale, gpus = sync_scale_of(cmd), cmd.configuration.total_gpus
    if scale and gpus > scale:
        return (f"job {cmd.job_id} has sync scale {scale}: it cannot run on {gpus} GPUs "
                "(each needs one of its micro-batches)")
    return None


def micro_batches_of(cmd: StartJob) -> tuple[int, ...]:
    """Each rank's micro-batches per step: the planner's split, else even
    (empty: not relaxed)."""
    scale = sync_scale_of(cmd)
    if not scale:
        return ()
    return cmd.micro_batches or even_split(scale, cmd.configuration.total_gpus)


def job_env(cmd: StartJob, opts: LaunchOptions, paths: JobPaths, local_rank: int) -> dict[str, str]:
    """The variables the executor sets for ``local_rank`` (see the module)."""
    world, local, nodes, rank_of_node = world_of(cmd)
    offset = 0 if cmd.mode == "profile" else rank_offset(cmd.configuration, cmd.server_id)
    meet = rendezvous_of(cmd)
    env = {
        jobenv.JOB_ID: cmd.job_id,
        jobenv.SERVER_ID: cmd.server_id,
        jobenv.GPU_TYPE: opts.gpu_type,
        jobenv.MODE: cmd.mode,
        jobenv.REPORT_FILE: str(paths.report),
        jobenv.CHECKPOINT_DIR: str(paths.checkpoint),
        jobenv.SAMPLES_DONE: repr(float(cmd.samples_done)),
        jobenv.TOTAL_SAMPLES: str(cmd.spec.total_samples),
        jobenv.BATCH_SIZE: str(cmd.spec.batch_size),
        jobenv.PROFILE_ITERS: str(opts.profile_iters),
        jobenv.SAMPLE_S: repr(float(opts.sample_s)),
        jobenv.TOTAL_GPUS: str(world),
        jobenv.LOCAL_GPUS: str(local),
        jobenv.NODES: str(nodes),
        jobenv.NODE_RANK: str(rank_of_node),
        "MASTER_ADDR": meet.master_addr,
        "MASTER_PORT": str(meet.master_port),
        "WORLD_SIZE": str(world),
        "RANK": str(offset + local_rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in cmd.gpu_indices),
        jobenv.CORES: str(cores_of(cmd)),
        jobenv.CORES_FILE: str(paths.cores),
    }
    split = micro_batches_of(cmd)
    env[jobenv.SYNC_SCALE] = str(cmd.spec.sync_scale if split else 0)
    env[jobenv.MICRO_BATCHES] = format_split(split)
    lr = cmd.spec.learning_rate(cmd.spec.sync_scale if split else world)
    if lr is not None:
        env[jobenv.LR] = repr(lr)
    if opts.threads is not None:
        env[jobenv.THREADS] = str(opts.threads)
    return env


def launches(cmd: StartJob, opts: LaunchOptions, paths: JobPaths,
             executor_env: Mapping[str, str],
             ident: JobIdentity | None = None, cores: tuple[int, ...] = ()) -> list[RankLaunch]:
    """Every process of ``cmd`` on this server, local rank 0 first, as
    ``ident`` (None: the executor's user) with what it may inherit of
    ``executor_env`` (:func:`executor.isolation.base_env`), pinned to the
    operator's cores for its device, else to ``cores`` (the job's)."""
    _, local, _, _ = world_of(cmd)
    inherited = base_env(executor_env, home=str(paths.root), user=ident.name if ident else "")
    uid, gid = (ident.uid, ident.gid) if ident is not None and ident.switch else (None, None)
    count = cores_of(cmd)
    out = []
    for k in range(local):
        env = dict(inherited)
        if count:  # before the job's env: a job may choose its own
            env["OMP_NUM_THREADS"] = str(max(1, count // local))
        elif opts.threads is not None:
            env["OMP_NUM_THREADS"] = str(opts.threads)
        env.update(cmd.spec.env)
        env.update(job_env(cmd, opts, paths, k))
        out.append(RankLaunch(local_rank=k, argv=tuple(cmd.spec.command), env=env,
                              cwd=cmd.spec.workdir or None, log=paths.log(k),
                              cpus=_operator_cores(cmd, opts, k) or cores, uid=uid, gid=gid))
    return out


def _operator_cores(cmd: StartJob, opts: LaunchOptions, local_rank: int) -> tuple[int, ...]:
    """The cores ``--cpu-affinity`` gives the device of ``local_rank`` (none
    given, or a CPU job, which has no device: none)."""
    if local_rank >= len(cmd.gpu_indices):
        return ()
    device = cmd.gpu_indices[local_rank]
    return opts.affinity[device] if device < len(opts.affinity) else ()


def parse_cores(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` → ``(0, 1, 2, 5)``."""
    cores: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise AffinityError(f"{part!r} is not a core or a range of cores") from None
        if first < 0 or last < first:
            raise AffinityError(f"{part!r} is not a range of cores")
        cores.extend(range(first, last + 1))
    return tuple(sorted(set(cores)))


def parse_affinity(text: str, server: str) -> tuple[tuple[int, ...], ...]:
    """The cores of each device of ``server``: ``"0|1"`` pins device 0 to
    core 0 and device 1 to core 1 (``"0-3|4-7"``: ranges); several servers
    share one setting as ``"a=0|1;b=1"``. Empty: no pinning."""
    text = text.strip()
    if not text:
        return ()
    if "=" in text:
        found = ""
        for item in text.split(";"):
            name, _, spec = item.partition("=")
            if name.strip() == server:
                found = spec
        text = found.strip()
        if not text:
            return ()
    return tuple(parse_cores(group) for group in text.split("|"))


def check_affinity(affinity: tuple[tuple[int, ...], ...], devices: int,
                   available: set[int]) -> None:
    """:class:`AffinityError` unless every device has cores this host has."""
    if affinity and len(affinity) < devices:
        raise AffinityError(f"the CPU affinity names cores for {len(affinity)} devices; "
                            f"the server has {devices}")
    missing = sorted({c for cores in affinity for c in cores} - available)
    if missing:
        raise AffinityError(f"the CPU affinity names cores {missing} this executor may not "
                            f"use (it may use {sorted(available)})")
