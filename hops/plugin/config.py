"""What a training process learns from its environment (Hops §3.2).

The node executor sets the variables of :mod:`shared.jobenv` and those of
PyTorch's distributed launch for every process it starts;
:func:`settings_from_env` reads them into :class:`Settings`. Arguments the
script passes win over the environment, which wins over the defaults, so a
script runs standalone too: without ``HOPS_JOB_ID`` it is in running mode
and, without a report file, reports nowhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

from shared import jobenv
from shared.relaxed import even_split, parse_split, split_problem

Mode = Literal["run", "profile"]
T = TypeVar("T")

DEFAULT_PROFILE_ITERS = jobenv.DEFAULT_PROFILE_ITERS
DEFAULT_WARMUP_ITERS = 3
DEFAULT_SAMPLE_S = jobenv.DEFAULT_SAMPLE_S


@dataclass(frozen=True)
class Settings:
    """One process's view of its job.

    ``total_samples`` None means no end but a stop (standalone runs).
    ``world_size``/``rank``/``local_rank`` are the distributed launch's;
    ``total_gpus`` is the allocation. ``sync_scale`` S > 0 makes the run
    relaxed scale-fixed (hare.md §2.2.3): each step processes S per-GPU
    batches over all ranks, rank r ``micro_batches[r]`` of them.
    """

    mode: Mode = "run"
    job_id: str = ""
    server_id: str = ""
    gpu_type: str = ""
    report_file: Path | None = None
    checkpoint_dir: Path | None = None
    batch_size: int = 0
    total_samples: float | None = None
    samples_done: float = 0.0
    profile_iters: int = DEFAULT_PROFILE_ITERS
    warmup_iters: int = DEFAULT_WARMUP_ITERS
    sample_s: float = DEFAULT_SAMPLE_S
    lr: float | None = None
    total_gpus: int = 1
    threads: int | None = None
    cores: int = 0  # CPU cores the job holds on this node at the start (0: none)
    cores_file: Path | None = None  # where the executor writes the count when it changes
    local_processes: int = 1  # processes of the job on this node (they share its cores)
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    node_rank: int = 0
    sync_scale: int = 0
    micro_batches: tuple[int, ...] = ()  # per rank; set exactly when sync_scale is

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def relaxed(self) -> bool:
        return self.sync_scale > 0

    @property
    def own_micro_batches(self) -> int:
        """This rank's per-GPU batches per step."""
        return self.micro_batches[self.rank] if self.relaxed else 1

    @property
    def first_micro_batch(self) -> int:
        """The index, among the step's, of this rank's first micro-batch."""
        return sum(self.micro_batches[: self.rank]) if self.relaxed else self.rank

    @property
    def step_batches(self) -> int:
        """Per-GPU batches a step processes over all ranks: its global batch
        is ``step_batches * batch_size``."""
        return self.sync_scale if self.relaxed else self.world_size

    @property
    def lr_gpus(self) -> int:
        """The GPUs the learning rate is for: those of the global batch."""
        return self.sync_scale if self.relaxed else self.total_gpus

    @property
    def writes_reports(self) -> bool:
        """Only local rank 0 of each node writes lines (shared.jobreport)."""
        return self.local_rank == 0 and self.report_file is not None


def _parse(env: Mapping[str, str], name: str, cast: Callable[[str], T], default: T) -> T:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return cast(raw)
    except ValueError:
        what = getattr(cast, "__name__", "value")
        raise ValueError(f"{name}={raw!r} is not a valid {what}") from None


def _path(raw: str) -> Path:
    return Path(raw)


def _check(settings: Settings) -> Settings:
    problems = []
    if settings.batch_size <= 0:
        problems.append("the batch size must be > 0 (pass batch_size or set HOPS_BATCH_SIZE)")
    if settings.total_samples is not None and settings.total_samples <= 0:
        problems.append("HOPS_TOTAL_SAMPLES must be > 0")
    if settings.samples_done < 0:
        problems.append("HOPS_SAMPLES_DONE must be >= 0")
    if settings.profile_iters <= 0 or settings.warmup_iters < 0:
        problems.append("HOPS_PROFILE_ITERS must be > 0 and warm-up iterations >= 0")
    if settings.sample_s <= 0:
        problems.append("HOPS_SAMPLE_S must be > 0")
    if settings.lr is not None and settings.lr <= 0:
        problems.append("HOPS_LR must be > 0")
    if settings.threads is not None and settings.threads <= 0:
        problems.append("HOPS_THREADS must be > 0")
    if settings.cores < 0 or settings.local_processes <= 0:
        problems.append("need HOPS_CORES >= 0 and LOCAL_WORLD_SIZE > 0")
    if not 0 <= settings.rank < settings.world_size or settings.total_gpus <= 0:
        problems.append("need 0 <= RANK < WORLD_SIZE and HOPS_TOTAL_GPUS > 0")
    if settings.sync_scale < 0:
        problems.append("HOPS_SYNC_SCALE must be >= 0")
    elif settings.relaxed and (why := split_problem(
            settings.sync_scale, settings.world_size, settings.micro_batches)):
        problems.append(f"HOPS_MICRO_BATCHES: {why}")
    if settings.mode not in ("run", "profile"):
        problems.append(f"HOPS_MODE must be 'run' or 'profile', got {settings.mode!r}")
    if problems:
        raise ValueError("; ".join(problems))
    return settings


def settings_from_env(
    env: Mapping[str, str],
    *,
    mode: Mode | None = None,
    batch_size: int | None = None,
    total_samples: float | None = None,
    report_file: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    profile_iters: int | None = None,
    warmup_iters: int | None = None,
    sample_s: float | None = None,
) -> Settings:
    """:class:`Settings` from ``env`` and the script's overrides (not None wins).

    ``HOPS_MODE`` counts only under an executor (``HOPS_JOB_ID`` set): a
    standalone run trains. ValueError names each malformed or out-of-range
    variable.
    """
    under_executor = bool(env.get(jobenv.JOB_ID))
    env_mode = env.get(jobenv.MODE, "run") if under_executor else "run"
    world = _parse(env, "WORLD_SIZE", int, 1)
    report, ckpt = _files(env, report_file, checkpoint_dir)
    settings = Settings(
        mode=mode or env_mode,  # type: ignore[arg-type]  # checked in _check
        job_id=env.get(jobenv.JOB_ID, ""),
        server_id=env.get(jobenv.SERVER_ID, ""),
        gpu_type=env.get(jobenv.GPU_TYPE, ""),
        report_file=report,
        checkpoint_dir=ckpt,
        batch_size=batch_size or _parse(env, jobenv.BATCH_SIZE, int, 0),
        total_samples=(total_samples if total_samples is not None
                       else _parse(env, jobenv.TOTAL_SAMPLES, float, None)),
        samples_done=_parse(env, jobenv.SAMPLES_DONE, float, 0.0),
        profile_iters=profile_iters or _parse(
            env, jobenv.PROFILE_ITERS, int, DEFAULT_PROFILE_ITERS),
        warmup_iters=warmup_iters if warmup_iters is not None else DEFAULT_WARMUP_ITERS,
        sample_s=sample_s or _parse(env, jobenv.SAMPLE_S, float, DEFAULT_SAMPLE_S),
        lr=_parse(env, jobenv.LR, float, None),
        total_gpus=_parse(env, jobenv.TOTAL_GPUS, int, world),
        threads=_parse(env, jobenv.THREADS, int, None),
        cores=_parse(env, jobenv.CORES, int, 0),
        cores_file=_parse(env, jobenv.CORES_FILE, _path, None),
        local_processes=_parse(env, "LOCAL_WORLD_SIZE", int, 1),
        world_size=world,
        rank=_parse(env, "RANK", int, 0),
        local_rank=_parse(env, "LOCAL_RANK", int, 0),
        node_rank=_parse(env, jobenv.NODE_RANK, int, 0),
    )
    return _check(_with_split(settings, env))


def _files(env: Mapping[str, str], report_file: str | Path | None,
           checkpoint_dir: str | Path | None) -> tuple[Path | None, Path | None]:
    """The report file and the checkpoint folder: the script's when it
    names them, else the executor's variables'."""
    report = report_file if report_file is not None else _parse(
        env, jobenv.REPORT_FILE, _path, None)
    ckpt = checkpoint_dir if checkpoint_dir is not None else _parse(
        env, jobenv.CHECKPOINT_DIR, _path, None)
    return (Path(report) if report is not None else None,
            Path(ckpt) if ckpt is not None else None)


def _with_split(settings: Settings, env: Mapping[str, str]) -> Settings:
    """The relaxed-sync split of ``env``: ``HOPS_MICRO_BATCHES``, or an even
    one when only ``HOPS_SYNC_SCALE`` is set (a standalone run: gradient
    accumulation over that many micro-batches)."""
    scale = _parse(env, jobenv.SYNC_SCALE, int, 0)
    raw = env.get(jobenv.MICRO_BATCHES, "")
    try:
        split = parse_split(raw)
    except ValueError as e:
        raise ValueError(f"{jobenv.MICRO_BATCHES}={raw!r}: {e}") from None
    if split and scale <= 0:
        raise ValueError(f"{jobenv.MICRO_BATCHES} needs {jobenv.SYNC_SCALE} > 0")
    if scale > 0 and not split:
        try:
            split = even_split(scale, settings.world_size)
        except ValueError as e:
            raise ValueError(f"{jobenv.SYNC_SCALE}={scale}: {e}") from None
    return replace(settings, sync_scale=scale, micro_batches=split)
