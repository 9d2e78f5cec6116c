"""Micro-batches: the relaxed scale-fixed step of one rank (hare.md §2.2.3).

A relaxed-sync job keeps its sync scale S, the per-GPU batches of a step,
on whichever k <= S GPUs it holds: rank r processes ``m_r`` of them one
after the other (the executor's ``HOPS_MICRO_BATCHES``, in proportion to
its GPU's speed, so that the fast GPUs do not wait for the slow ones at the
synchronisation, §2.2.2), accumulating gradients, and the ranks all-reduce
once, in the backward pass of each rank's last micro-batch: the ones before
run under DistributedDataParallel's ``no_sync()``.

**The gradient is the global batch's.** With a loss that is the mean over
its micro-batch of b samples, the gradient of the global batch of S·b
samples is (1/S) Σ over the S micro-batches of ∇(micro-batch loss). Rank r
accumulates c · Σ over its m_r micro-batches of ∇loss, and DDP's
all-reduce divides the sum over the k ranks by k; so c = k / S gives
exactly that mean (up to floating-point summation order). Without DDP
(one process) k = 1 and c = 1/S. The all-reduce is the plugin's DDP
(:meth:`hops.plugin.Run.wrap`), whose ``no_sync()`` the step enters. A
job without a sync scale has one micro-batch per rank and c = 1: the
ordinary data-parallel step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar, cast

import torch
from torch.nn.parallel import DistributedDataParallel

from hops.plugin.config import Settings

L = TypeVar("L", bound=torch.Tensor)


@dataclass(frozen=True)
class MicroBatch:
    """One per-GPU batch of a step on this rank.

    ``index`` is its place among the step's micro-batches of all ranks
    (0 .. S-1 for a relaxed job, the rank otherwise): a script that makes
    its own data may seed by it. ``local`` counts this rank's, of ``count``.
    """

    index: int
    local: int
    count: int
    factor: float  # what the loss is multiplied by (see the module doc)

    @property
    def last(self) -> bool:
        """The micro-batch whose backward pass all-reduces the gradients."""
        return self.local == self.count - 1

    def scale(self, loss: L) -> L:
        """``loss`` (a mean over this micro-batch) weighted so that the
        accumulated, all-reduced gradient is the global batch's mean."""
        # The loss's own static type stays (often Any, from a module's call).
        return cast(L, loss * self.factor) if self.factor != 1.0 else loss


def loss_factor(settings: Settings) -> float:
    """c of the module doc: k / S, the all-reduce averaging over the k ranks
    (``WORLD_SIZE``; one process: 1 / S); 1 for a job that is not relaxed."""
    if not settings.relaxed:
        return 1.0
    return settings.world_size / settings.sync_scale


def micro_batches(settings: Settings,
                  wrapped: Iterable[DistributedDataParallel]) -> Iterator[MicroBatch]:
    """This rank's micro-batches of one step, all but the last under every
    wrapped model's ``no_sync()`` (gradients accumulate locally)."""
    models = list(wrapped)
    count = settings.own_micro_batches
    factor = loss_factor(settings)
    first = settings.first_micro_batch
    for local in range(count):
        micro = MicroBatch(first + local, local, count, factor)
        with contextlib.ExitStack() as stack:
            if not micro.last:
                for ddp in models:
                    stack.enter_context(ddp.no_sync())
            yield micro
