"""Checkpoints: what a stopped job resumes from (Hops §3.6: a job the
scheduler moves, resizes or preempts stops and starts again elsewhere).

One file, ``<HOPS_CHECKPOINT_DIR>/latest.pt``, replaced atomically (written
to a temporary file in the same folder, synced, then ``os.replace``), so a
reader sees the old checkpoint or the new one, never half of one. It holds
the unwrapped module's ``state_dict`` (no ``module.`` prefix of
DistributedDataParallel), the optimizer's, and the samples done. Data
parallelism keeps both identical on every rank, so a checkpoint written at
world size N loads at any world size M.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

LATEST = "latest.pt"
FORMAT = 1


def unwrap(model: nn.Module) -> nn.Module:
    """The module a DistributedDataParallel (or DataParallel) wraps."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model


@dataclass(frozen=True)
class Loaded:
    """A checkpoint read back: where from, and the progress it holds."""

    path: Path
    samples_done: float
    world_size: int


def latest(directory: Path) -> Path:
    return directory / LATEST


def save(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    samples_done: float,
    world_size: int,
) -> Path:
    """Write the checkpoint atomically; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {
        "format": FORMAT,
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "samples_done": float(samples_done),
        "world_size": int(world_size),
        "saved_at": time.time(),
    }
    final = latest(directory)
    tmp = directory / f".{LATEST}.{os.getpid()}.tmp"
    try:
        with tmp.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _sync_dir(directory)
    return final


def _sync_dir(directory: Path) -> None:
    # The rename is durable only once the folder's entry is on disk.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> Loaded | None:
    """Load the latest checkpoint into ``model`` (and ``optimizer``); None if
    there is none. A checkpoint that cannot be read raises: silently
    starting over would redo the job's work and misreport its progress."""
    path = latest(directory)
    if not path.exists():
        return None
    # weights_only: a checkpoint folder may be shared storage; never unpickle code from it.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint of this plugin")
    unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    return Loaded(path=path, samples_done=float(state["samples_done"]),
                  world_size=int(state["world_size"]))
