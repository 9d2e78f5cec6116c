"""``python -m executor``: the node executor, EMULATED or REAL.

``python -m executor --cluster paper-physical --server-id titanxp-0 [--time-scale 60]``
runs the emulated executor of one server (jobs train nothing,
:mod:`executor.emulated`); ``--backend real`` runs each job's own command,
one process per GPU (:mod:`executor.real`). ``python -m executor --cluster C
--all`` supervises one executor process per server of ``C``
(:mod:`executor.supervisor`), passing every other flag on. ``--cluster`` is
a built-in cluster name or a cluster spec file.

Besides the runtime's settings (:mod:`services.runtime.settings`), each
flag below overrides its environment variable:

=========================  ======================  ==========  ==============================
variable                   flag                    default     meaning
=========================  ======================  ==========  ==============================
``HOPS_CLUSTER``           ``--cluster``           required    cluster name or file
``HOPS_SERVER_ID``         ``--server-id``         required    this executor's server
                           ``--order``             its index   adjacency order to register
``HOPS_EXECUTOR_BACKEND``  ``--backend``           emulated    ``emulated`` or ``real``
``HOPS_EXECUTOR_ADDRESS``  ``--address``           127.0.0.1   rendezvous address of peers
``HOPS_TIME_SCALE``        ``--time-scale``        1           emulated seconds per second
``HOPS_HEARTBEAT_S``       ``--heartbeat-s``       1           node and job heartbeat period
``HOPS_SAMPLE_S``          ``--sample-s``          10          running-mode sample period
``HOPS_STOP_GRACE_S``      ``--stop-grace-s``      5           SIGTERM to SIGKILL on a stop
``HOPS_START_TIMEOUT_S``   ``--start-timeout-s``   30          wait for a job's first beat
``HOPS_PROFILE_ITERS``     ``--profile-iters``     20          iterations of a profiling run
``HOPS_RUN_DIR``           ``--run-dir``           see below   jobs' logs, checkpoints
``HOPS_LOG_CAP_BYTES_S``   ``--log-cap-bytes-s``   65536       a job's output shipped, bytes/s
``HOPS_LOG_CAP_BURST_...`` ``--log-cap-burst-...`` 1048576     ... and its burst (docs/logs.md)
``HOPS_CPU_AFFINITY``      ``--cpu-affinity``      none        real jobs: cores per device
``HOPS_THREADS``           ``--threads-per-gpu``   see below   real jobs: threads per process
``HOPS_JOB_USER``          ``--job-user``          none        real jobs run as this user
``HOPS_ALLOW_ROOT_JOBS``   ``--allow-root-jobs``   off (0)     root executor may run jobs as root
``HOPS_TRAINERS_PER_GPU``  ``--trainers-per-gpu``  2           resident trainers per GPU (tasks)
``HOPS_DETERMINISTIC_...`` ``--deterministic-...`` off (0)     trainers: deterministic algorithms
``HOPS_TASK_PARAMS_...``   ``--task-params-...``   120         a task's wait for its params (s)
=========================  ======================  ==========  ==============================

The two switches (``HOPS_ALLOW_ROOT_JOBS``, ``HOPS_DETERMINISTIC_TRAINERS``)
take ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``, in any
case; any other value stops the executor with exit code 2.

The run folder defaults to ``<HOPS_DATA_DIR or ./.hops>/runs``. The CPU
affinity pins device i's process to cores: ``"0|1"`` (device 0 on core 0,
device 1 on core 1; ranges as ``"0-3|4-7"``; per server as ``"a=0|1;b=1"``).
Without it, a real executor pins each job holding cores to as many core
ids of its own affinity, chosen for the job alone (:mod:`executor.cores`);
given, the operator's cores take precedence and no job is pinned otherwise.
Threads per process (``HOPS_THREADS`` and ``OMP_NUM_THREADS`` of the job)
default to 1 on declared (CPU) devices and are left to the job on GPUs.
The real executor discovers its GPUs through NVML; without NVML it says so
and runs the GPUs the cluster file declares. With NVML, a count other than
the declared one stops it with exit code 2. It registers the CPU cores and
memory (GiB) the cluster file declares for its server (``cores``,
``memory_gb``), or else those of this host (the cores it may use, the
memory ``os.sysconf`` or ``/proc/meminfo`` reports); an emulated executor
registers what the file declares (0, by default: none is scheduled).

A real executor running as root runs its jobs as ``--job-user`` (a name or
a uid; no supplementary groups) and stops at once with exit code 2 when
none is set, or it is root, unless ``--allow-root-jobs``; or when the job
user cannot reach the run folder. Not root, it runs jobs as its own user.
Either way a job inherits almost nothing of the executor's environment
(:mod:`executor.isolation`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import structlog
from structlog.typing import FilteringBoundLogger

from executor.discovery import (
    DiscoveryError,
    discover,
    host_cores,
    host_memory_gb,
    with_host_capacity,
)
from executor.isolation import JobIdentity, JobUserError, unreachable
from executor.launch import AffinityError, check_affinity, parse_affinity
from executor.service import run_node
from executor.settings import ExecutorSettings, job_identity
from executor.supervisor import supervise
from services.runtime.logging import configure_logging
from services.runtime.service import ServiceContext, serve
from services.runtime.settings import (
    RuntimeSettings,
    SettingsError,
    build_parser,
    env_bool,
    env_float,
    env_int,
    parse_args,
)
from shared import jobenv
from shared.cluster import Cluster
from shared.ids import ServerId
from shared.specs import SpecError
from world.clusters import cluster_arg

BACKENDS = ("emulated", "real")
# Each number's flag and variable; its default is the settings' own.
_NUMBERS = (
    ("time_scale", "HOPS_TIME_SCALE", float),
    ("heartbeat_s", "HOPS_HEARTBEAT_S", float),
    ("sample_s", jobenv.SAMPLE_S, float),
    ("stop_grace_s", "HOPS_STOP_GRACE_S", float),
    ("start_timeout_s", "HOPS_START_TIMEOUT_S", float),
    ("profile_iters", jobenv.PROFILE_ITERS, int),
    ("log_cap_bytes_s", "HOPS_LOG_CAP_BYTES_S", float),
    ("log_cap_burst_bytes", "HOPS_LOG_CAP_BURST_BYTES", float),
    ("trainers_per_gpu", "HOPS_TRAINERS_PER_GPU", int),
    ("task_params_wait_s", "HOPS_TASK_PARAMS_WAIT_S", float),
)
# Each switch's flag and variable: the flag turns it on; without it, the
# variable decides, and a value that is neither on nor off is an error.
_SWITCHES = {
    "allow_root_jobs": "HOPS_ALLOW_ROOT_JOBS",
    "deterministic_trainers": "HOPS_DETERMINISTIC_TRAINERS",
}
# Beyond the stop grace, for the executor to stop its jobs when it is stopped.
_SHUTDOWN_MARGIN_S = 3.0


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _parser() -> argparse.ArgumentParser:
    p = build_parser("executor")
    p.add_argument("--cluster", default=_env("HOPS_CLUSTER"),
                   help="built-in cluster or cluster file; overrides $HOPS_CLUSTER")
    p.add_argument("--server-id", default=_env("HOPS_SERVER_ID"),
                   help="the server this executor runs; overrides $HOPS_SERVER_ID")
    p.add_argument("--order", type=int, default=None,
                   help="adjacency order to register (default: the server's index)")
    p.add_argument("--all", action="store_true", help="one executor per server (supervisor)")
    p.add_argument("--backend", choices=BACKENDS,
                   default=_env("HOPS_EXECUTOR_BACKEND") or "emulated",
                   help="emulated jobs or the jobs' own commands; overrides "
                        "$HOPS_EXECUTOR_BACKEND (default emulated)")
    p.add_argument("--address", default=_env("HOPS_EXECUTOR_ADDRESS") or "127.0.0.1",
                   help="address the peers of a distributed job meet at; overrides "
                        "$HOPS_EXECUTOR_ADDRESS (default 127.0.0.1)")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="real jobs' logs, checkpoints and reports; overrides $HOPS_RUN_DIR "
                        "(default <$HOPS_DATA_DIR or ./.hops>/runs)")
    p.add_argument("--cpu-affinity", default=_env("HOPS_CPU_AFFINITY") or "",
                   help='cores per device of real jobs, e.g. "0|1" or "a=0|1;b=1"; overrides '
                        "$HOPS_CPU_AFFINITY")
    p.add_argument("--threads-per-gpu", type=int, default=None,
                   help="threads per process of a real job; overrides $HOPS_THREADS "
                        "(default 1 on declared devices)")
    p.add_argument("--job-user", default=_env("HOPS_JOB_USER") or "",
                   help="user (name or uid) real jobs run as when the executor is root; "
                        "overrides $HOPS_JOB_USER")
    p.add_argument("--allow-root-jobs", action="store_true",
                   help="let an executor running as root run jobs as root "
                        "($HOPS_ALLOW_ROOT_JOBS=1)")
    p.add_argument("--deterministic-trainers", action="store_true",
                   help="resident trainers use torch's deterministic algorithms only: "
                        "bitwise task replays on a GPU, slower ($HOPS_DETERMINISTIC_TRAINERS=1)")
    for name, var, kind in _NUMBERS:
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                       help=f"overrides ${var} (default {_default(name)})")
    return p


def _default(name: str) -> float:
    default = next(f.default for f in dataclasses.fields(ExecutorSettings) if f.name == name)
    assert isinstance(default, int | float)
    return default


def _switch(args: argparse.Namespace, name: str) -> bool:
    """Switch ``name`` (a key of ``_SWITCHES``): on when its flag is given,
    else as its variable says (SettingsError: neither on nor off)."""
    return bool(getattr(args, name)) or env_bool(_SWITCHES[name], False)


def run_dir_of(args: argparse.Namespace) -> Path:
    """The run folder, absolute: jobs run in folders of their own."""
    if args.run_dir is not None:
        return Path(args.run_dir).resolve()
    if _env("HOPS_RUN_DIR"):
        return Path(os.environ["HOPS_RUN_DIR"]).resolve()
    return (Path(_env("HOPS_DATA_DIR") or ".hops") / "runs").resolve()


def executor_settings(args: argparse.Namespace, cluster: Cluster) -> ExecutorSettings:
    """The executor's settings: flags over environment variables over defaults."""
    values: dict[str, float | int] = {}
    for name, var, kind in _NUMBERS:
        flag = getattr(args, name)
        if flag is not None:
            values[name] = flag
        elif kind is int:
            values[name] = env_int(var, int(_default(name)), minimum=1)
        else:
            values[name] = env_float(var, float(_default(name)))
    if values["time_scale"] <= 0 or values["heartbeat_s"] <= 0 or values["sample_s"] <= 0:
        raise SpecError("time scale, heartbeat and sample periods must be > 0")
    if values["log_cap_bytes_s"] <= 0 or values["log_cap_burst_bytes"] <= 0:
        raise SpecError("the log cap's rate and burst must be > 0")
    server_id = ServerId(args.server_id)
    order = args.order if args.order is not None else cluster.server_index[server_id]
    threads = args.threads_per_gpu
    if threads is None and _env("HOPS_THREADS"):
        threads = env_int("HOPS_THREADS", 1, minimum=1)
    if threads is not None and threads < 1:
        raise SpecError(f"threads per GPU must be >= 1, got {threads}")
    affinity = parse_affinity(args.cpu_affinity, server_id)
    check_affinity(affinity, cluster.by_id[server_id].gpus, os.sched_getaffinity(0))
    return ExecutorSettings(cluster=args.cluster, server_id=server_id, order=order,
                            backend=args.backend, address=args.address,
                            run_dir=run_dir_of(args), threads=threads, affinity=affinity,
                            job_user=args.job_user,
                            allow_root_jobs=_switch(args, "allow_root_jobs"),
                            deterministic_trainers=_switch(args, "deterministic_trainers"),
                            **values)  # type: ignore[arg-type]


def with_devices(settings: ExecutorSettings, cluster: Cluster) -> ExecutorSettings:
    """A real executor's settings with the devices it found, after saying
    where they come from (DiscoveryError: NVML contradicts the cluster file)."""
    log = structlog.get_logger()
    found = discover(cluster.by_id[settings.server_id])
    if found.source == "declared":
        log.warning(found.message, devices=len(found.devices))
    else:
        log.info(found.message, devices=[d.name for d in found.devices])
    threads = settings.threads
    if threads is None and found.source == "declared":
        threads = 1  # a CPU "device" is a core: one thread each, not one per core
    server = with_host_capacity(cluster.by_id[settings.server_id], host_cores(),
                                host_memory_gb())
    log.info("capacity", cores=server.cores, memory_gb=server.memory_gb)
    return replace(settings, devices=found.devices, threads=threads, server=server)


def checked_identity(settings: ExecutorSettings) -> JobIdentity:
    """Who the real jobs will run as, after checking that they may:
    :class:`JobUserError` with the reason when they may not (an unknown job
    user, root without --allow-root-jobs, a run folder it cannot reach)."""
    ident = job_identity(settings)
    why = ident.refusal()
    if why is not None:
        raise JobUserError(why)
    if ident.switch:
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        settings.run_dir.chmod(0o711)  # jobs reach their own folder, list none
        wall = unreachable(settings.run_dir, ident.uid, ident.gid)
        if wall is not None:
            raise JobUserError(f"job user {ident.name} cannot reach the run folder "
                               f"{settings.run_dir}: {wall} is closed to it; choose "
                               "another --run-dir (or --data-dir under hops up)")
    return ident


def _identity_or_none(settings: ExecutorSettings,
                      log: FilteringBoundLogger) -> JobIdentity | None:
    """The jobs' identity (logged); None, said loudly, when no job may run:
    the executor then exits rather than look healthy and refuse every job."""
    try:
        ident = checked_identity(settings)
    except JobUserError as e:
        log.error("real jobs cannot run as configured", error=str(e))
        print(f"hops-executor: {e}", file=sys.stderr)
        return None
    log.info("job user", user=ident.name, uid=ident.uid, switch=ident.switch, note=ident.note)
    return ident


def _run(settings: ExecutorSettings, cluster: Cluster, runtime: RuntimeSettings) -> int:
    """Run one executor as a service (the real one after finding its devices
    and checking who its jobs run as)."""
    log = configure_logging("executor", runtime.log_level)
    structlog.contextvars.bind_contextvars(server_id=settings.server_id)
    if settings.backend == "real":
        ident = _identity_or_none(settings, log)
        if ident is None:
            return 2
        try:
            settings = with_devices(settings, cluster)
        except DiscoveryError as e:
            log.error("devices do not match the cluster file", error=str(e))
            print(f"hops-executor: {e}", file=sys.stderr)
            return 2
        settings = replace(settings, job_identity=ident)
        settings.run_dir.mkdir(parents=True, exist_ok=True)

    async def node_main(ctx: ServiceContext) -> None:
        await run_node(ctx, settings, cluster)

    grace = settings.stop_grace_s + _SHUTDOWN_MARGIN_S
    try:
        # No ensure_jetstream: an executor's identity has no JetStream API; the
        # monitor makes the streams before it answers the registration.
        return asyncio.run(serve("executor", node_main, runtime, grace=grace,
                                 ensure_streams=False))
    except KeyboardInterrupt:
        return 130
    except Exception:
        log.exception("service failed")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    runtime, args = parse_args(argv, service="executor", parser=parser)
    if not args.cluster:
        parser.error("--cluster (or HOPS_CLUSTER) is required")
    try:
        cluster = cluster_arg(args.cluster)
    except (SpecError, OSError, ValueError) as e:
        parser.error(str(e))
    try:
        # Read here as well, so that a bad value stops a supervisor (--all) at
        # once rather than each child it would restart.
        switches = {name: _switch(args, name) for name in _SWITCHES}
    except SettingsError as e:
        parser.error(str(e))
    if args.all:
        log = configure_logging("executor-supervisor", runtime.log_level)
        if args.backend == "real":  # once here, rather than each child failing for ever
            first = ExecutorSettings(cluster=args.cluster, server_id=cluster.servers[0].id,
                                     run_dir=run_dir_of(args), job_user=args.job_user,
                                     allow_root_jobs=switches["allow_root_jobs"])
            if _identity_or_none(first, log) is None:
                return 2
        return asyncio.run(supervise(cluster, argv, log))
    if not args.server_id:
        parser.error("--server-id (or HOPS_SERVER_ID) is required without --all")
    if args.server_id not in cluster.by_id:
        parser.error(f"server {args.server_id!r} is not in cluster {cluster.name}")
    try:
        settings = executor_settings(args, cluster)
    except (ValueError, AffinityError) as e:
        parser.error(str(e))
    return _run(settings, cluster, runtime)


if __name__ == "__main__":
    sys.exit(main())
