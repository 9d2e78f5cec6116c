"""Job specification: user-selectable requirement sets and learning rates (Hops §2.2)."""

from __future__ import annotations

import math
import re
from typing import Literal

import msgspec

from shared import jobenv
from shared.ids import JobId, TenantId

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ScalingRule = Literal["linear", "sqrt"]
JobKind = Literal["gpu", "cpu"]
# CODA §IV-B: the categories whose CPU-GPU interaction differs; "other" is a
# job whose owner gave none (the start point then comes from history only).
Category = Literal["cv", "nlp", "speech", "other"]


class CoreHints(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What an owner may say of a training job's CPU side (CODA §V-B-1): it
    pipelines data loading (``pipeline``: one core fewer to start), has many
    weights (``many_weights``: one fewer), or heavy preprocessing between
    iterations (``complex_preprocessing``: one more)."""

    pipeline: bool = False
    many_weights: bool = False
    complex_preprocessing: bool = False


# The longest time limit a job may ask for (``time_limit``, seconds of
# running time): a year, so that a typo of a few digits is refused, not kept.
MAX_TIME_LIMIT_S = 365 * 86400

# R_num of §2.2: requirements a min/max range is turned into (every policy's
# default).
R_NUM = 8


class JobSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a user submits.

    Either ``requirements`` (the explicit set R = {R1..Rn}) or the bounds
    ``min_gpus``/``max_gpus`` must be given; with bounds, the operator's
    ``R_num`` turns them into equally spaced requirements (§2.2).

    The learning rate is either a table ``lr`` {gpus: rate}, or one ``base_lr``
    valid at ``base_gpus`` plus a scaling ``lr_rule`` (linear [Goyal et al.]
    or square-root [Krizhevsky]).

    ``command`` is what a real node executor runs, as an argument list (never
    through a shell), in ``workdir`` with ``env`` added; one process per
    GPU. Without a command, only an emulated executor can run the job.

    ``kind`` is ``gpu`` (a training job, the default) or ``cpu`` (CODA's CPU
    job: it asks for ``cores`` CPU cores on one server and no GPUs, and gives
    no requirements; its ``total_samples`` is its work in core-seconds). For
    a GPU job ``cores`` is what its owner asked for in all (0: nothing
    stated), which the baselines that take requests as given use;
    ``category`` and ``hints`` seed CODA's adaptive core allocation.

    ``sync_scale`` S > 0 makes a GPU job relaxed scale-fixed (hare.md
    §2.2.3): every step processes S per-GPU batches, its global batch and
    learning rate those of S GPUs, on whichever k <= S GPUs it holds, each
    rank a share of micro-batches proportional to its GPU's speed
    (:mod:`shared.relaxed`). Its requirements may then not exceed S. 0, the
    default: synchronous data parallel, one batch per GPU per step.

    ``time_limit`` (Slurm's ``--time``) is the most seconds of wall time the
    job may spend running, all its runs summed (time queued after a
    preemption is not counted); a job that reaches it is stopped with a
    checkpoint and ends ``cancelled`` with the reason ``TimeLimit``
    (:mod:`scheduling.live.timelimit`). ``None``, the default: no limit.
    """

    id: JobId
    model: str
    batch_size: int
    params: int
    total_samples: int
    tenant: TenantId = TenantId("default")
    requirements: tuple[int, ...] = ()
    min_gpus: int | None = None
    max_gpus: int | None = None
    lr: dict[int, float] = {}
    base_lr: float | None = None
    base_gpus: int = 1
    lr_rule: ScalingRule = "linear"
    submit_time: float = 0.0
    command: tuple[str, ...] = ()
    workdir: str = ""
    env: dict[str, str] = {}
    kind: JobKind = "gpu"
    cores: int = 0
    category: Category = "other"
    hints: CoreHints = CoreHints()
    sync_scale: int = 0
    time_limit: float | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("id must not be empty")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {self.batch_size}")
        if self.params <= 0:
            raise ValueError(f"params must be > 0, got {self.params}")
        if self.total_samples <= 0:
            raise ValueError(f"total_samples must be > 0, got {self.total_samples}")
        if self.cores < 0:
            raise ValueError(f"cores must be >= 0, got {self.cores}")
        if self.sync_scale < 0:
            raise ValueError(f"sync_scale must be >= 0, got {self.sync_scale}")
        if self.kind == "cpu":
            self._check_cpu_job()
        else:
            self._check_requirements()
        for gpus, rate in self.lr.items():
            if gpus <= 0 or rate <= 0:
                raise ValueError(f"lr: entry {gpus}: {rate} must have gpus > 0 and rate > 0")
        if self.base_lr is not None and self.base_lr <= 0:
            raise ValueError("base_lr must be > 0")
        if self.base_gpus <= 0:
            raise ValueError("base_gpus must be > 0")
        self._check_command()
        self._check_time_limit()

    def _check_time_limit(self) -> None:
        limit = self.time_limit
        if limit is not None and not 0 < limit <= MAX_TIME_LIMIT_S:  # NaN fails too
            raise ValueError(f"time_limit: must be > 0 and <= {MAX_TIME_LIMIT_S} seconds "
                             f"(a year), got {limit}")

    def _check_command(self) -> None:
        if self.command and not self.command[0]:
            raise ValueError("command: the program (first entry) must not be empty")
        if any("\x00" in a for a in self.command):
            raise ValueError("command: arguments must not contain NUL bytes")
        if (self.workdir or self.env) and not self.command:
            raise ValueError("workdir and env need a command")
        for key, value in self.env.items():
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"env: {key!r} is not a valid variable name")
            if key in jobenv.RESERVED:
                raise ValueError(f"env: {key} is set by the executor and cannot be overridden")
            if "\x00" in value:
                raise ValueError(f"env: the value of {key} contains a NUL byte")

    def _check_cpu_job(self) -> None:
        if self.cores <= 0:
            raise ValueError("a cpu job needs cores > 0")
        if self.requirements or self.min_gpus is not None or self.max_gpus is not None:
            raise ValueError("a cpu job asks for cores, not GPUs: give no requirements")
        if self.lr or self.base_lr is not None:
            raise ValueError("a cpu job takes no learning rate")
        if self.sync_scale:
            raise ValueError("a cpu job takes no sync_scale")

    def _check_requirements(self) -> None:
        if self.requirements:
            if self.min_gpus is not None or self.max_gpus is not None:
                raise ValueError("requirements: give either the set or min_gpus/max_gpus, not both")
            if any(r <= 0 for r in self.requirements):
                raise ValueError("requirements: every entry must be > 0")
            self._check_sync_scale(max(self.requirements))
            return
        if self.min_gpus is None or self.max_gpus is None:
            raise ValueError("requirements: give the set or both min_gpus and max_gpus")
        if self.min_gpus <= 0 or self.max_gpus < self.min_gpus:
            bounds = f"[{self.min_gpus}, {self.max_gpus}]"
            raise ValueError(f"requirements: need 0 < min_gpus <= max_gpus, got {bounds}")
        self._check_sync_scale(self.max_gpus)

    def _check_sync_scale(self, most: int) -> None:
        # Each of the k GPUs processes at least one of the S micro-batches of a step.
        if self.sync_scale and most > self.sync_scale:
            raise ValueError(f"sync_scale: a relaxed-sync job runs on at most sync_scale = "
                             f"{self.sync_scale} GPUs; its requirements go up to {most}")

    def requirement_set(self, r_num: int = R_NUM) -> tuple[int, ...]:
        """The sorted requirement set R; bounds become ``r_num`` equal steps
        (a CPU job's is empty)."""
        if self.kind == "cpu":
            return ()
        if self.requirements:
            return tuple(sorted(set(self.requirements)))
        assert self.min_gpus is not None and self.max_gpus is not None
        lo, hi = self.min_gpus, self.max_gpus
        if r_num <= 1 or lo == hi:
            return (lo,)
        step = (hi - lo) / (r_num - 1)
        return tuple(sorted({round(lo + i * step) for i in range(r_num)}))

    def learning_rate(self, gpus: int) -> float | None:
        """The learning rate for ``gpus`` GPUs (per-GPU batch size is fixed, §2.2)."""
        if gpus in self.lr:
            return self.lr[gpus]
        if self.base_lr is None:
            return None
        ratio = gpus / self.base_gpus
        factor = ratio if self.lr_rule == "linear" else math.sqrt(ratio)
        return self.base_lr * factor
