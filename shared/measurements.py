"""What the profiler plugin and running jobs report (Hops §3.2).

In *profiling mode* the plugin measures the basic time modules of a training
iteration once per GPU type (:class:`ProfileReport`); in *running mode* it
keeps reporting data-loading and synchronisation-wait times, which fluctuate
and need long-term statistics (§3.5), alongside the measured per-GPU
throughput (:class:`ThroughputSample`).
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from shared.ids import GpuType, JobId, ServerId

Pattern = Literal[1, 2]


def _check_times(name: str, values: tuple[float, ...]) -> None:
    for v in values:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}: every time must be finite and >= 0, got {v}")


def _check_paired(data: tuple[float, ...], waits: tuple[float, ...], what: str) -> None:
    _check_times(f"{what} data times", data)
    _check_times(f"{what} wait times", waits)
    if waits and len(waits) != len(data):
        raise ValueError(
            f"{what}: wait times are paired with data times per iteration; "
            f"got {len(waits)} waits for {len(data)} data times"
        )


class TimeModules(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Basic time modules of one iteration (Eq. 1), in seconds.

    ``t_f``, ``t_b``, ``t_u`` (forward, backward, update) are stable and taken
    once; ``t_d`` and ``t_w`` are per-iteration samples of data time and
    synchronisation wait, paired by index (``t_w`` may be empty: no wait was
    measured, read as zeros). ``pattern`` is the overlap pattern of Eq. (1).

    What a data-parallel iteration of the job would communicate, counted by
    the profiling plugin from the model it wraps (0 and ``False``: not known,
    as for a job profiled without the plugin): ``buckets`` is the number of
    gradient all-reduces (DistributedDataParallel's buckets), ``broadcasts``
    the other collectives (module-buffer broadcasts in the forward pass), and
    ``agreement`` whether the ranks also meet once per iteration (the
    plugin's stop flag, where it measures T_w). The estimator charges each
    collective the latency α of the GPU type (a departure: Eq. (2) has one
    all-reduce and no latency).
    """

    t_f: float = 0.0
    t_b: float = 0.0
    t_u: float = 0.0
    pattern: Pattern = 1
    t_d: tuple[float, ...] = ()
    t_w: tuple[float, ...] = ()
    buckets: int = 0
    broadcasts: int = 0
    agreement: bool = False

    def __post_init__(self) -> None:
        _check_times("time modules", (self.t_f, self.t_b, self.t_u))
        if self.pattern not in (1, 2):
            raise ValueError(f"pattern must be 1 or 2, got {self.pattern}")
        if self.buckets < 0 or self.broadcasts < 0:
            raise ValueError("buckets and broadcasts must be >= 0, got "
                             f"{self.buckets} and {self.broadcasts}")
        _check_paired(self.t_d, self.t_w, "time modules")

    def paired_waits(self) -> tuple[float, ...]:
        """``t_w`` aligned with ``t_d``; an unmeasured wait counts as zero."""
        return self.t_w if self.t_w else (0.0,) * len(self.t_d)


class ProfileReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A profiling-mode run of ``job_id`` on one server of ``gpu_type``.

    ``batch_size`` is the per-GPU batch the modules were measured with; 0
    means the job's own batch size. ``signature`` is the job's profile
    signature (:func:`shared.reuse.profile_signature`), under which the
    database shares the modules with the signature's other jobs; empty (as
    in reports written before it was kept): shared with none.
    """

    job_id: JobId
    gpu_type: GpuType
    server_id: ServerId
    modules: TimeModules = TimeModules()
    batch_size: int = 0
    signature: str = ""

    def __post_init__(self) -> None:
        if self.batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {self.batch_size}")


class ThroughputSample(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One running-mode observation of ``job_id`` on ``server_id``.

    The job holds ``local_gpus`` GPUs on this server and ``total_gpus`` over
    ``nodes`` servers. ``per_gpu_throughput`` is in samples/s per GPU; 0 means
    this report carries only data/wait observations. ``data_times`` and
    ``wait_times`` are per-iteration samples paired by index (``wait_times``
    may be empty, read as zeros).

    ``comm_times`` are measured per-iteration gradient all-reduce times T_c
    (seconds; the plugin times DDP's buckets from the first launch to the
    last completion), empty where the job did not measure them (one GPU, or
    no hook). The estimator uses their mean for this placement's shape in
    place of Eq. (2) (a departure: §3.2 has running mode record only data
    and wait times).

    ``cores`` is the number of CPU cores the job's process ran on when the
    sample was taken (0: not known), next to its data times, for CODA's
    adaptive CPU allocation.
    """

    job_id: JobId
    server_id: ServerId
    gpu_type: GpuType
    local_gpus: int = 1
    nodes: int = 1
    total_gpus: int = 1
    per_gpu_throughput: float = 0.0
    data_times: tuple[float, ...] = ()
    wait_times: tuple[float, ...] = ()
    comm_times: tuple[float, ...] = ()
    cores: int = 0

    def __post_init__(self) -> None:
        if self.cores < 0:
            raise ValueError(f"cores must be >= 0, got {self.cores}")
        if self.local_gpus <= 0 or self.nodes <= 0:
            raise ValueError("local_gpus and nodes must be > 0")
        if self.total_gpus < self.local_gpus or self.total_gpus < self.nodes:
            raise ValueError(
                f"total_gpus={self.total_gpus} must cover local_gpus={self.local_gpus} "
                f"and one GPU per node ({self.nodes})"
            )
        if self.nodes == 1 and self.total_gpus != self.local_gpus:
            raise ValueError("on one node, total_gpus must equal local_gpus")
        tput = self.per_gpu_throughput
        if not math.isfinite(tput) or tput < 0:
            raise ValueError(f"per_gpu_throughput must be finite and >= 0, got {tput}")
        _check_paired(self.data_times, self.wait_times, "sample")
        _check_times("sample comm times", self.comm_times)

    def paired_waits(self) -> tuple[float, ...]:
        """``wait_times`` aligned with ``data_times``; unmeasured waits are zero."""
        return self.wait_times if self.wait_times else (0.0,) * len(self.data_times)
