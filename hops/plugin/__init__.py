"""The in-job plugin: what a PyTorch training script adds to run under Hops.

Hops §3.2 puts the profiler's measuring inside each job, as a plugin with
two modes, chosen by the node executor through ``HOPS_MODE``:

- **profiling** (``profile``): a few warm-up iterations, then
  ``HOPS_PROFILE_ITERS`` measured ones (the paper's 10-50; default 20); one
  ``Profiled`` report with Eq. (1)'s time modules (T_f, T_b, T_u as
  medians, T_d and T_w per iteration, the pattern); no checkpoint;
- **running** (``run``): ``Started``; every ``HOPS_SAMPLE_S`` seconds a
  ``Sampled`` report (this process's samples/s and per-iteration T_d, T_w
  and all-reduce times, §3.5, and the CPU cores it ran on) and a
  ``Progress`` report; ``Finished`` once
  the job's ``HOPS_TOTAL_SAMPLES`` are done. SIGTERM means: checkpoint at
  the next iteration boundary all ranks agree on, report ``Checkpointed``,
  exit 0. A start resumes from the latest checkpoint.

Reports are :mod:`shared.jobreport` lines appended to ``HOPS_REPORT_FILE``
by local rank 0 of each node; the other variables are in
:mod:`shared.jobenv`. Without ``HOPS_JOB_ID`` a script runs standalone (in
running mode, reporting to ``report_file`` if given, else nowhere)::

    import sys
    from hops import plugin

    run = plugin.init(batch_size=32)       # first: SIGTERM handling, threads
    run.setup_distributed()                # WORLD_SIZE > 1: gloo on CPU, NCCL on CUDA
    model = run.wrap(Net())                # DDP when distributed, all-reduce timed
    lr = run.learning_rate(base_lr=0.1, base_gpus=1, rule="linear")  # HOPS_LR wins
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    run.resume(model, opt)                 # latest checkpoint, if any
    batches = run.loader(dataset, num_workers=2)  # or run.batches(any_iterable)
    for step in run.steps():
        for micro in step.micro_batches():  # one, unless the job is relaxed-sync
            with step.data():
                x, y = next(batches)
            with step.forward():
                loss = micro.scale(loss_fn(model(x), y))
            with step.backward():
                loss.backward()
        with step.update():
            opt.step()
            opt.zero_grad()
    sys.exit(run.close())                  # 0 after a finish, a profile or a stop

A relaxed-sync job (``HOPS_SYNC_SCALE`` S, hare.md §2.2.3) keeps S per-GPU
batches a step on however many GPUs it holds: each rank processes its
share (``HOPS_MICRO_BATCHES``) as micro-batches, accumulating gradients
under DDP's ``no_sync()`` until the last; ``micro.scale`` weights the loss
so that the all-reduced gradient is the global batch's mean, and the
learning rate and the progress are those of S GPUs
(:mod:`hops.plugin.micro`). A script written as above runs either way.

The executor may change the job's CPU cores while it runs (CODA): the
loop then follows, resizing torch's threads, and ``run.cores`` says how
many it holds now (:mod:`hops.plugin.cores`).

How each measurement is taken, and how the pattern of Eq. (1) is detected,
is in :mod:`hops.plugin.measure`, :mod:`hops.plugin.data` and
:mod:`hops.plugin.dist`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hops.plugin.config import Mode, Settings, settings_from_env
from hops.plugin.data import TimedBatch, TimedCollate, TimedDataset, TimedLoader
from hops.plugin.measure import IterationTimes, ScalingRule, detect_pattern, scaled_lr
from hops.plugin.micro import MicroBatch
from hops.plugin.run import Run
from hops.plugin.step import Step

__all__ = [
    "IterationTimes",
    "MicroBatch",
    "Mode",
    "Run",
    "ScalingRule",
    "Settings",
    "Step",
    "TimedBatch",
    "TimedCollate",
    "TimedDataset",
    "TimedLoader",
    "detect_pattern",
    "init",
    "scaled_lr",
    "settings_from_env",
]


def init(
    *,
    batch_size: int | None = None,
    total_samples: float | None = None,
    mode: Mode | None = None,
    report_file: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    profile_iters: int | None = None,
    warmup_iters: int | None = None,
    sample_s: float | None = None,
    env: Mapping[str, str] | None = None,
    handle_sigterm: bool = True,
) -> Run:
    """The run of this process, from ``env`` (default: ``os.environ``) with
    the given arguments winning over it.

    Call it first, before building models: it installs the SIGTERM handler
    (``handle_sigterm``) and sets torch's threads from ``HOPS_THREADS``.
    ValueError names a malformed or missing setting (e.g. no batch size).
    """
    settings = settings_from_env(
        os.environ if env is None else env,
        mode=mode, batch_size=batch_size, total_samples=total_samples,
        report_file=report_file, checkpoint_dir=checkpoint_dir,
        profile_iters=profile_iters, warmup_iters=warmup_iters, sample_s=sample_s,
    )
    return Run(settings, handle_sigterm=handle_sigterm)
