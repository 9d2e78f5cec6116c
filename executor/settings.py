"""A node executor's settings, and what follows from them alone.

:class:`ExecutorSettings` is what ``python -m executor`` parses its flags
and variables into; :func:`job_identity` and :func:`advertised` derive who
real jobs run as and which server the executor registers. They stand apart
from the shell (:mod:`executor.service`) because the command line reads them
before any bus exists, and need none of the shell's connections.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from executor.isolation import JobIdentity, lookup_user, resolve_identity
from executor.membw import RESCTRL
from shared import jobenv
from shared.cluster import Cluster, Server
from shared.ids import ServerId
from shared.logs import CAP_BURST_BYTES, CAP_RATE_BYTES_S
from shared.node import Device


@dataclass(frozen=True)
class ExecutorSettings:
    """See ``python -m executor --help`` and docs/events.md for the variables."""

    cluster: str
    server_id: ServerId
    order: int = 0
    time_scale: float = 1.0
    heartbeat_s: float = 1.0
    sample_s: float = jobenv.DEFAULT_SAMPLE_S
    stop_grace_s: float = 5.0
    start_timeout_s: float = 30.0
    profile_iters: int = jobenv.DEFAULT_PROFILE_ITERS
    # Each job's output shipped to HOPS_LOGS (executor.logship): bytes/s and burst.
    log_cap_bytes_s: float = CAP_RATE_BYTES_S
    log_cap_burst_bytes: float = CAP_BURST_BYTES
    register_retry_s: float = 1.0
    backend: str = "emulated"
    address: str = "127.0.0.1"
    run_dir: Path = Path(".hops/runs")
    threads: int | None = None  # per process of a real job (None: the job's own)
    affinity: tuple[tuple[int, ...], ...] = ()  # device index -> cores, real jobs
    devices: tuple[Device, ...] = ()  # what the executor registers (real: discovered)
    job_user: str = ""  # real jobs run as this user ('' : none configured)
    allow_root_jobs: bool = False  # an executor running as root may run jobs as root
    job_identity: JobIdentity | None = None  # resolved from the two above (real)
    server: Server | None = None  # as advertised (real: host cores, memory); None: the file's
    resctrl: Path = RESCTRL  # real: where memory bandwidth is read and capped (executor.mba)
    # Resident trainer processes per GPU for Hare's tasks (executor.trainers).
    trainers_per_gpu: int = 2
    # Trainers run torch's deterministic algorithms only: bitwise replays of a
    # task on a GPU (cuDNN's convolution gradients otherwise differ in their
    # last bits), at some speed (docs/hare.md §7, step 4d).
    deterministic_trainers: bool = False
    # The longest a task waits for its round's parameters from the job's aggregator.
    task_params_wait_s: float = 120.0


def job_identity(settings: ExecutorSettings) -> JobIdentity:
    """Who this executor's real jobs run as (:class:`JobUserError` if the
    job user does not exist)."""
    return resolve_identity(settings.job_user, settings.allow_root_jobs, os.geteuid(),
                            os.getegid(), lookup_user)


def advertised(settings: ExecutorSettings, cluster: Cluster) -> Server:
    """The server this executor registers: the cluster file's entry, with
    the cores and memory a real executor found when the file declares none."""
    return settings.server or cluster.by_id[settings.server_id]
