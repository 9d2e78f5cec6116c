"""The run: one training process of a job under the plugin (Hops §3.2).

:class:`Run` owns the loop's lifecycle (distributed setup, learning rate,
resume, the iterations, the reports, the checkpoint on stop, the
shutdown); :class:`hops.plugin.step.Step` times one iteration's phases. See
:mod:`hops.plugin` for the walk-through.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterable, Iterator, Mapping
from types import FrameType, TracebackType
from typing import Any, Literal, TypeVar

import msgspec
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from hops.plugin import checkpoint
from hops.plugin.config import Mode, Settings
from hops.plugin.cores import CoresWatch, affinity_cores, set_threads
from hops.plugin.data import DataClock, TimedLoader, make_loader
from hops.plugin.dist import (
    Agreement,
    CommTimer,
    ddp_collectives,
    init_group,
    shutdown,
    wrap_ddp,
)
from hops.plugin.measure import (
    IterationTimes,
    SamplePeriod,
    ScalingRule,
    samples_done,
    scaled_lr,
    time_modules,
)
from hops.plugin.report import Reporter
from hops.plugin.step import Step
from shared.jobreport import AnyReport, Checkpointed, Finished, Profiled, Progress, Started

log = logging.getLogger("hops.plugin")
B = TypeVar("B")
End = Literal["", "finished", "stopped", "profiled"]


class Run:
    """One process of a job; build it with :func:`hops.plugin.init`."""

    def __init__(self, settings: Settings, *, handle_sigterm: bool = True) -> None:
        self.settings = settings
        if settings.threads:
            set_threads(settings.threads)
        self._cores = CoresWatch(settings.cores_file, settings.cores, settings.local_processes,
                                 settings.threads)
        cuda = torch.cuda.is_available()
        self.device = torch.device(f"cuda:{settings.local_rank}" if cuda else "cpu")
        self._reporter = Reporter(settings.report_file if settings.writes_reports else None)
        self._clock = DataClock()
        self._agreement: Agreement | None = None
        self._wrapped: list[DistributedDataParallel] = []
        self._comm_timer: CommTimer | None = None
        # What a data-parallel iteration of the wrapped models communicates
        # (gradient all-reduces, buffer broadcasts), for the profile.
        self._collectives = (0, 0)
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._resumed: checkpoint.Loaded | None = None
        self._start_samples = settings.samples_done
        self._iterations = 0
        self._records: list[IterationTimes] = []
        self._period: SamplePeriod | None = None
        self._end: End = ""
        self._stop_agreed = False
        self._failed = False
        self._looping = False
        self._closed: int | None = None
        self.stop_requested = False
        self._previous_handler: Any = None
        self._handles_sigterm = False
        if handle_sigterm:
            try:
                self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
                self._handles_sigterm = True
            except ValueError:  # not the main thread: the script's stops are its own affair
                log.warning("SIGTERM is not handled: init() ran outside the main thread")

    # ---- what the script asks -------------------------------------------

    @property
    def mode(self) -> Mode:
        return self.settings.mode

    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def rank_batch(self) -> int:
        """Samples this process handles per iteration (its micro-batches')."""
        return self.settings.batch_size * self.settings.own_micro_batches

    @property
    def iterations(self) -> int:
        return self._iterations

    @property
    def cores(self) -> int:
        """The CPU cores the job holds on this node now (0: none allocated)."""
        return self._cores.count

    @property
    def samples_done(self) -> float:
        """Samples done over the whole job (all ranks), resume point included."""
        s = self.settings
        return samples_done(self._start_samples, self._iterations, s.batch_size,
                            s.step_batches, s.total_samples)

    def setup_distributed(self, timeout_s: float = 300.0) -> bool:
        """Join the job's process group when ``WORLD_SIZE`` > 1 (idempotent);
        whether the run is distributed."""
        if not self.settings.distributed:
            return False
        if self._agreement is None:
            if not dist.is_initialized():
                init_group(self.settings, self.device, timeout_s)
            self._agreement = Agreement(self.device)
        return True

    def wrap(self, model: nn.Module, **ddp_kwargs: Any) -> nn.Module:
        """``model`` on the run's device; in DistributedDataParallel when
        distributed, its gradient all-reduce timed (gloo)."""
        model = model.to(self.device)
        buckets, broadcasts = ddp_collectives(model, **ddp_kwargs)
        self._collectives = (self._collectives[0] + buckets, self._collectives[1] + broadcasts)
        if not self.setup_distributed():
            return model
        if self.device.type == "cpu":
            self._comm_timer = CommTimer()
        ddp = wrap_ddp(model, self.device, self._comm_timer, **ddp_kwargs)
        self._wrapped.append(ddp)
        return ddp

    def learning_rate(self, base_lr: float, base_gpus: int = 1, rule: ScalingRule = "linear",
                      table: Mapping[int, float] | None = None) -> float:
        """§2.2: ``HOPS_LR`` when the executor set it, else the user's
        ``table`` entry or ``base_lr`` scaled by ``rule`` for
        ``HOPS_TOTAL_GPUS`` (default ``WORLD_SIZE``) GPUs, or for
        ``HOPS_SYNC_SCALE`` of a relaxed-sync job (its global batch's)."""
        if self.settings.lr is not None:
            return self.settings.lr
        return scaled_lr(self.settings.lr_gpus, base_lr, base_gpus, rule, table)

    def resume(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> float:
        """Register what a stop checkpoints, and load the latest checkpoint
        (running mode): the samples done, from the checkpoint when there is
        one, else ``HOPS_SAMPLES_DONE``."""
        self._model, self._optimizer = model, optimizer
        directory = self.settings.checkpoint_dir
        if self.mode == "run" and directory is not None:
            self._resumed = checkpoint.load(directory, model, optimizer)
            if self._resumed is not None:
                self._start_samples = self._resumed.samples_done
                log.info("resumed from %s at %.0f samples", self._resumed.path,
                         self._resumed.samples_done)
        return self._start_samples

    def loader(self, dataset: Dataset[Any], batch_size: int | None = None,
               **kwargs: Any) -> TimedLoader[Any]:
        """A DataLoader over ``dataset`` (this rank's shard) whose batches'
        production time the plugin measures; ``kwargs`` go to
        :func:`hops.plugin.data.make_loader` (``num_workers``, ``shuffle``,
        ``seed``, ``collate_fn``, DataLoader options)."""
        return make_loader(dataset, self.settings, self._clock, batch_size, **kwargs)

    def batches(self, source: Iterable[B]) -> TimedLoader[B]:
        """Batches from any iterable, endlessly (re-iterated at its end when
        it can be); each ``next()`` is timed as the batch's production."""
        return TimedLoader(source, self._clock)

    # ---- the loop ---------------------------------------------------------

    def steps(self) -> Iterator[Step]:
        """Iterations until the job's samples are done (running mode), the
        profile is measured (profiling mode), or a stop was agreed."""
        if self._looping or self._end:
            raise RuntimeError("steps() runs once per run")
        self._looping = True
        self.setup_distributed()
        self._begin()
        boundary = time.perf_counter()
        while not self._over():
            s = self.settings
            left = (s.total_samples - self.samples_done) if s.total_samples is not None else None
            full = float(s.batch_size * s.step_batches)
            step = Step(self, self._iterations, min(full, left) if left is not None else full)
            yield step
            boundary = self._finish_iteration(step, boundary)

    def _begin(self) -> None:
        if self.mode == "run":
            path = str(self._resumed.path) if self._resumed is not None else ""
            self._report(Started(at=time.time(), samples_done=self.samples_done, checkpoint=path,
                                 world_size=self.settings.world_size))
        self._period = SamplePeriod(started=time.perf_counter(), batch_size=self.rank_batch)

    def _over(self) -> bool:
        """Whether the loop ends here, at an iteration boundary: done work
        wins over a stop (a job that did its samples finishes)."""
        s = self.settings
        if self.mode == "run" and s.total_samples is not None \
                and self.samples_done >= s.total_samples:
            self._end = "finished"
        elif self.mode == "profile" and len(self._records) >= s.profile_iters:
            self._end = "profiled"
            self._report_profile()
        elif self._stop_agreed or (self.stop_requested and not s.distributed):
            # One process agrees with itself; several stop on the flag they
            # all got from the same iteration's meeting.
            self._end = "stopped"
        return bool(self._end)

    def _agree(self, step: Step) -> None:
        if step.agreed:
            return
        step.agreed = True
        if self._agreement is not None:
            stop, step.wait = self._agreement(self.stop_requested)
            self._stop_agreed = self._stop_agreed or stop

    def _finish_iteration(self, step: Step, boundary: float) -> float:
        self._agree(step)
        now = time.perf_counter()
        record = step.times(now - boundary)
        self._iterations += 1
        self._cores.poll()
        if self.mode == "profile":
            if self._iterations > self.settings.warmup_iters:
                self._records.append(record)
        elif self._period is not None:
            self._period.add(record)
            if now - self._period.started >= self.settings.sample_s:
                self._report_period(now)
        return now

    def _device_sync(self) -> None:
        # Profiling times phases; CUDA runs them asynchronously to the host.
        if self.mode == "profile" and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- reports ----------------------------------------------------------

    def _report(self, line: AnyReport) -> None:
        self._reporter.write(line)

    def _report_period(self, now: float) -> None:
        period = self._period
        if period is not None:
            sampled = period.line(now, self.samples_done, time.time(), affinity_cores())
            if sampled is not None:
                self._report(sampled)
            self._period = SamplePeriod(started=now, batch_size=self.rank_batch)
        self._report(Progress(at=time.time(), samples_done=self.samples_done,
                              iterations=self._iterations))

    def _report_profile(self) -> None:
        records = self._records
        seconds = sum(r.total for r in records)
        throughput = self.rank_batch * len(records) / seconds if seconds > 0 else 0.0
        buckets, broadcasts = self._collectives
        modules = msgspec.structs.replace(time_modules(records), buckets=buckets,
                                          broadcasts=broadcasts, agreement=True)
        self._report(Profiled(at=time.time(), modules=modules,
                              batch_size=self.batch_size, iterations=len(records),
                              throughput=throughput))

    # ---- the end ----------------------------------------------------------

    def close(self) -> int:
        """Final reports, the checkpoint when stopped (running mode, global
        rank 0), and a clean distributed shutdown; the exit code for the
        script: 0, or 1 when a requested checkpoint could not be written.
        A model :meth:`wrap` put in DDP is detached from the group by then:
        use its ``.module`` afterwards."""
        if self._closed is not None:
            return self._closed
        code = 0
        try:
            if self.mode == "run":
                code = self._close_running()
        finally:
            self._agreement = None  # it may hold a group of its own
            shutdown(self._wrapped, meet=not self._failed)
            self._reporter.close()
            if self._handles_sigterm:
                # None: the handler was not set from Python; the default is what it was.
                previous = self._previous_handler
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        self._closed = code
        return code

    def _close_running(self) -> int:
        self._report_period(time.perf_counter())
        if self._end == "finished":
            self._report(Finished(at=time.time(), samples_done=self.samples_done))
            return 0
        if self._end == "stopped" and self.settings.rank == 0:
            return self._save()
        return 0

    def _save(self) -> int:
        directory = self.settings.checkpoint_dir
        if directory is None or self._model is None:
            log.warning("stopped without a checkpoint: %s", "no HOPS_CHECKPOINT_DIR"
                        if directory is None else "run.resume(model, optimizer) was not called")
            return 0
        try:
            path = checkpoint.save(directory, self._model, self._optimizer,
                                   self.samples_done, self.settings.world_size)
        except Exception:
            log.exception("the checkpoint could not be written to %s", directory)
            return 1
        self._report(Checkpointed(at=time.time(), samples_done=self.samples_done,
                                  path=str(path)))
        return 0

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the loop stops at the next iteration boundary all ranks agree on.
        self.stop_requested = True

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # After an error the other ranks are elsewhere: leave without meeting them.
        self._failed = exc is not None
        self.close()


