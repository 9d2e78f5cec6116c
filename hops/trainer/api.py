"""What a training script offers to run as Hare tasks (docs/hare.md §7).

Hare's executors run a relaxed-sync job's round as tasks, micro-batches
``lo .. hi - 1`` of its S, on whichever GPUs the schedule gives them, and
send each task's gradients to the job's aggregator
(:mod:`hops.aggregator`). A resident trainer process cannot run the
script's own loop for that: it needs the script's model, optimiser, data
and loss as values it can call one micro-batch at a time. A script offers
them through a function ``hops_task(config) -> TaskJob``, which
:func:`load_task` finds.

**The data is a function of the global micro-batch index** k = round · S +
m (m in 0 .. S-1), deterministic in k, so that a micro-batch is the same
whichever process and GPU runs it, and the aggregator's sum is the one
process's exactly (:func:`reference_rounds`, Hare §2.1, Eq. (3)).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch
from torch import nn

ENTRY: Final = "hops_task"  # the function a script defines to offer its tasks
_loaded = itertools.count()  # a fresh module name for each script loaded


@dataclass(frozen=True)
class TaskJob:
    """A job's training, as a task runner calls it: ``batch(k)`` is global
    micro-batch k (module doc), ``loss(model, batch)`` its loss, the mean
    over the micro-batch (not scaled by 1/S: the runner scales it)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Callable[[int], object]  # global micro-batch k = round * S + m, deterministic in k
    loss: Callable[[nn.Module, object], torch.Tensor]


def load_task(script: str | Path, config: Mapping[str, object]) -> TaskJob:
    """Import ``script`` by its path (as a module of its own, never as
    ``__main__``: its ``main()`` does not run) and return its
    ``hops_task(config)``. ValueError when it has no such function or the
    function returns something else."""
    path = Path(script)
    spec = importlib.util.spec_from_file_location(f"_hops_task_{next(_loaded)}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python script that can be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entry = getattr(module, ENTRY, None)
    if not callable(entry):
        raise ValueError(f"{path} defines no {ENTRY}(config) function, so it cannot run as "
                         "tasks: give it one returning a hops.trainer.TaskJob")
    job = entry(config)
    if not isinstance(job, TaskJob):
        raise ValueError(f"{path}: {ENTRY}(config) returned a {type(job).__name__}, "
                         "not a hops.trainer.TaskJob")
    return job


def option_flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """``parser``'s options by destination (``batch_size``: ``["--batch-size"]``):
    the config keys :func:`script_options` gives to the script."""
    return {a.dest: list(a.option_strings) for a in parser._actions if a.option_strings}


def script_options(parser: argparse.ArgumentParser,
                   config: Mapping[str, object]) -> argparse.Namespace:
    """The script's options as ``parser`` reads them from ``config``: a key
    that is an option's destination (``batch_size`` for ``--batch-size``)
    gives that option its value (True: the bare flag; False: left out), so
    the script's own types and checks apply; other keys (``sync_scale``,
    ``learning_rate``) are the runner's and left alone."""
    options = option_flags(parser)
    argv: list[str] = []
    for key, value in config.items():
        flags = options.get(key)
        if not flags or value is False:
            continue
        flag = next((f for f in flags if f.startswith("--")), flags[0])
        argv.extend([flag] if value is True else [flag, str(value)])
    return parser.parse_args(argv)


def micro_batch_seed(seed: int, k: int) -> int:
    """A generator seed for global micro-batch ``k`` of a job seeded
    ``seed``: a SplitMix64 step of the pair, so that nearby seeds and
    indices draw unrelated batches."""
    z = (seed * 0x9E3779B97F4A7C15 + k + 1) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return (z ^ (z >> 31)) >> 1  # below 2**63: any torch generator takes it


def _check_span(round_: int, lo: int, hi: int, sync_scale: int) -> None:
    if sync_scale < 1 or round_ < 0 or not 0 <= lo < hi <= sync_scale:
        raise ValueError(f"need S >= 1, round >= 0 and 0 <= lo < hi <= S, got S = {sync_scale},"
                         f" round {round_}, micro-batches {lo}..{hi - 1}")


def _backward(job: TaskJob, k: int, sync_scale: int) -> None:
    """Micro-batch k's loss, scaled by 1/S, backward: its gradient added to
    ``.grad``. The loss is c · mean with c = 1/S, the plugin's factor for a
    one-process relaxed job (:func:`hops.plugin.micro.loss_factor`, k = 1
    rank), so that the S micro-batches' sum is the global batch's mean."""
    loss = job.loss(job.model, job.batch(k))
    if sync_scale != 1:
        loss = loss * (1 / sync_scale)
    loss.backward()  # type: ignore[no-untyped-call]  # frees the graph as it goes


def task_gradients(job: TaskJob, round_: int, lo: int, hi: int,
                   sync_scale: int) -> tuple[dict[str, torch.Tensor], ...]:
    """Micro-batches ``lo .. hi - 1`` of round ``round_``, each on its own
    (gradients zeroed first): one detached gradient per micro-batch,
    parameter name -> gradient, a parameter with none left out. Each
    micro-batch's graph, activations and batch are dropped as its backward
    pass ends (Hare's early task cleaning, §4), and the model holds no
    gradient afterwards: they belong to the caller."""
    _check_span(round_, lo, hi, sync_scale)
    params = dict(job.model.named_parameters())
    out: list[dict[str, torch.Tensor]] = []
    for m in range(lo, hi):
        job.model.zero_grad(set_to_none=True)
        _backward(job, round_ * sync_scale + m, sync_scale)
        out.append({n: p.grad.detach() for n, p in params.items() if p.grad is not None})
    job.model.zero_grad(set_to_none=True)
    return tuple(out)


def reference_rounds(job: TaskJob, sync_scale: int, rounds: int) -> None:
    """The one-process loop the tasks must reproduce: each round's S
    micro-batches in order, their gradients accumulated in ``.grad``, then
    one optimiser step and the gradients cleared (the script's own loop
    under the plugin with ``HOPS_SYNC_SCALE`` = S)."""
    if sync_scale < 1 or rounds < 0:
        raise ValueError(f"need S >= 1 and rounds >= 0, got S = {sync_scale}, {rounds} rounds")
    for round_ in range(rounds):
        for m in range(sync_scale):
            _backward(job, round_ * sync_scale + m, sync_scale)
        job.optimizer.step()
        job.optimizer.zero_grad(set_to_none=True)


def sync_scale_of(config: Mapping[str, object]) -> int:
    """S of ``config`` (``sync_scale``; 1 when absent: a round of one
    micro-batch). ValueError for anything but an int >= 1."""
    scale = config.get("sync_scale", 1)
    if type(scale) is not int or scale < 1:
        raise ValueError(f"sync_scale: need an int >= 1, got {scale!r}")
    return scale
