"""The plugin's pure logic: per-iteration timings into Eq. (1)'s time modules.

Nothing here touches torch, files or clocks; the run loop
(:mod:`hops.plugin.run`) measures and this module decides what the
measurements mean (Hops §3.2, §3.5):

- :class:`IterationTimes` is one iteration: the main loop's wait for its
  batch, the batch's production time, forward, backward, update, the
  synchronisation wait T_w and the gradient all-reduce's timing;
- :func:`detect_pattern` picks the pattern of Eq. (1) the job follows;
- :func:`time_modules` makes the ``Profiled`` line's
  :class:`~shared.measurements.TimeModules`;
- :class:`SamplePeriod` makes running mode's ``Sampled`` lines;
- :func:`scaled_lr` is §2.2's learning rate for an allocation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from shared.jobreport import Sampled
from shared.measurements import Pattern, TimeModules

ScalingRule = Literal["linear", "sqrt"]

OVERLAP_THRESHOLD = 0.8
"""Pattern 1 when the main loop waits less than this share of a batch's
production time (see :func:`detect_pattern`)."""

MAX_PER_LINE = 50
"""Per-iteration times in one ``Sampled`` line, at most (§3.5 wants many
over the job's life, not all of them in one line)."""


@dataclass(frozen=True, slots=True)
class IterationTimes:
    """One training iteration, in seconds.

    ``data_wait`` is how long the main loop waited for its batch (the time
    spent in ``step.data()``); ``production`` how long making that batch
    took where a plugin loader measured it (None otherwise), already divided
    by the number of loader workers that produce batches side by side.
    ``comm`` is the gradient all-reduce's span in backward (first bucket
    launched to last bucket done) and ``comm_exposed`` its part after the
    last bucket was launched, i.e. after backward's computation ended: the
    communication BP did not hide (T̃c of Eq. 1). Both None without
    DistributedDataParallel. ``total`` is boundary to boundary.
    """

    data_wait: float = 0.0
    production: float | None = None
    forward: float = 0.0
    backward: float = 0.0
    update: float = 0.0
    sync_wait: float = 0.0
    comm: float | None = None
    comm_exposed: float | None = None
    total: float = 0.0

    @property
    def data_time(self) -> float:
        """T_d of Eq. (1): the batch's production time; where it was not
        measured, the wait (a loader that produces in the main loop makes the
        two the same)."""
        return self.production if self.production is not None else self.data_wait

    @property
    def compute_backward(self) -> float:
        """T_b without the communication it did not hide (DDP's backward
        returns only when every bucket's all-reduce is done)."""
        return max(0.0, self.backward - (self.comm_exposed or 0.0))


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def detect_pattern(
    waits: Sequence[float],
    productions: Sequence[float | None],
    threshold: float = OVERLAP_THRESHOLD,
) -> Pattern:
    """The pattern of Eq. (1), from measurements.

    Pattern 1 overlaps data loading with BP, communication and update: a
    loader that prepares batches in the background (worker processes) has
    the next batch ready, or nearly, when the main loop asks, so the loop
    waits less than the batch's production time. Pattern 2 loads serially
    after the update: the batch is made inside the loop's wait, so the wait
    is at least the production time (a ratio of 1 or more, by
    construction). The rule: pattern 1 when median(wait) < ``threshold`` ·
    median(production). The threshold sits below 1 with a margin because
    the wait also holds costs that are not production (handing a finished
    batch over from a worker process takes a few milliseconds), and those
    are noisy.

    Without production times (the script did not use a plugin loader) the
    wait is all that is known; pattern 2 with T_d = wait then reproduces the
    measured iteration exactly, so it is the answer. A data-bound pattern-1
    loader (production much longer than the iteration's compute) waits
    nearly its production time and reads as pattern 2; Eq. (1) then
    overestimates the iteration by the compute time, which is small next to
    T_d in that case.
    """
    pairs = [(w, p) for w, p in zip(waits, productions, strict=True) if p is not None]
    if not pairs:
        return 2
    production = _median([p for _, p in pairs])
    if production <= 0.0:
        return 2
    wait = _median([w for w, _ in pairs])
    return 1 if wait < threshold * production else 2


def time_modules(
    records: Sequence[IterationTimes], threshold: float = OVERLAP_THRESHOLD
) -> TimeModules:
    """Eq. (1)'s modules of the measured iterations (profiling mode, §3.2).

    T_f, T_b and T_u are stable (§3.5): their medians, robust to a stray
    slow iteration. T_b excludes the communication BP did not hide. T_d and
    T_w are per iteration, paired by index, for the estimator's Eq. (3).
    """
    pattern = detect_pattern(
        [r.data_wait for r in records], [r.production for r in records], threshold
    )
    return TimeModules(
        t_f=_median([r.forward for r in records]),
        t_b=_median([r.compute_backward for r in records]),
        t_u=_median([r.update for r in records]),
        pattern=pattern,
        t_d=tuple(r.data_time for r in records),
        t_w=tuple(r.sync_wait for r in records),
    )


def evenly(n: int, k: int = MAX_PER_LINE) -> list[int]:
    """At most ``k`` indices of ``range(n)``, evenly spread, first and last kept."""
    if n <= k:
        return list(range(n))
    if k <= 1:
        return [n - 1][:k]
    return [round(i * (n - 1) / (k - 1)) for i in range(k)]


@dataclass
class SamplePeriod:
    """Running mode's iterations since the last ``Sampled`` line (§3.2: data
    and wait times keep being recorded, with the measured throughput)."""

    started: float
    batch_size: int
    records: list[IterationTimes] = field(default_factory=list)

    def add(self, record: IterationTimes) -> None:
        self.records.append(record)

    def line(self, now: float, samples_done: float, at: float,
             cores: int = 0) -> Sampled | None:
        """The period's ``Sampled`` line (None when it holds no iteration);
        ``cores``: the cores the process ran on (its affinity at the end).

        Per-process throughput = batch_size · iterations / seconds over the
        period: with the per-GPU batch fixed (§2.2) it is the per-GPU rate.
        """
        seconds = now - self.started
        if not self.records or seconds <= 0.0:
            return None
        picked = [self.records[i] for i in evenly(len(self.records))]
        comm = tuple(r.comm for r in picked if r.comm is not None)
        return Sampled(
            at=at,
            samples_done=samples_done,
            per_gpu_throughput=self.batch_size * len(self.records) / seconds,
            data_times=tuple(r.data_time for r in picked),
            wait_times=tuple(r.sync_wait for r in picked),
            comm_times=comm if len(comm) == len(picked) else (),
            cores=cores,
        )


def scaled_lr(
    gpus: int,
    base_lr: float,
    base_gpus: int = 1,
    rule: ScalingRule = "linear",
    table: Mapping[int, float] | None = None,
) -> float:
    """§2.2: the learning rate for ``gpus`` GPUs with the per-GPU batch fixed.

    A rate the user gave for exactly ``gpus`` wins; otherwise ``base_lr``
    (valid at ``base_gpus``) scales linearly [Goyal et al.] or with the
    square root [Krizhevsky] of the global batch's growth. The same rule as
    :meth:`shared.job.JobSpec.learning_rate`.
    """
    if gpus <= 0 or base_gpus <= 0:
        raise ValueError(f"gpus and base_gpus must be > 0, got {gpus} and {base_gpus}")
    if table and gpus in table:
        return table[gpus]
    ratio = gpus / base_gpus
    return base_lr * (ratio if rule == "linear" else math.sqrt(ratio))


def samples_done(
    resumed: float, iterations: int, batch_size: int, step_batches: int, total: float | None
) -> float:
    """Samples done over the whole job: the resume point plus this run's
    iterations at the global batch (``step_batches`` per-GPU batches: the
    world size, or a relaxed-sync job's sync scale), never more than the
    job's total (the last iteration may be cut short)."""
    done = resumed + iterations * batch_size * step_batches
    return min(done, total) if total is not None else float(done)
