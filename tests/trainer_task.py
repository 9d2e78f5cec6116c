"""A tiny task script for the resident trainer's tests (a linear model on
seeded data, and switches that make a task fail or its trainer die), and
the tests' comparison of gradients."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

import torch
from torch import nn

from hops.trainer.api import TaskJob, micro_batch_seed


def hops_task(config: Mapping[str, object]) -> TaskJob:
    seed = int(cast(int, config.get("seed", 0)))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    die_once = str(config.get("die_once", ""))  # SIGKILL itself once, at this micro-batch
    die_at = int(cast(int, config.get("die_at", 1)))
    sleep_s = float(cast(float, config.get("sleep_s", 0.0)))  # a longer task: staging seen

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if die_once and k == die_at and not Path(die_once).exists():
            Path(die_once).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        if config.get("fail"):
            raise RuntimeError("this task fails on purpose")
        if config.get("need_deterministic") and not torch.are_deterministic_algorithms_enabled():
            raise RuntimeError("deterministic algorithms are off")
        time.sleep(sleep_s)
        g = torch.Generator().manual_seed(micro_batch_seed(seed, k))
        return torch.randn(4, 8, generator=g), torch.randint(2, (4,), generator=g)

    def loss(net: nn.Module, drawn: object) -> torch.Tensor:
        x, y = cast(tuple[torch.Tensor, torch.Tensor], drawn)
        out: torch.Tensor = nn.functional.cross_entropy(net(x), y)
        return out

    return TaskJob(model, optimizer, batch, loss)


def same_gradients(a: Sequence[Mapping[str, torch.Tensor]],
                   b: Sequence[Mapping[str, torch.Tensor]]) -> bool:
    """Per micro-batch, the same parameters' gradients, bitwise."""
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True))
