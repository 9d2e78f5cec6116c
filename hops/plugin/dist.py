"""torch.distributed for the plugin: the group, the per-iteration agreement
that measures T_w, the all-reduce timer, and a clean shutdown (Hops §3.5).

**T_w and the stop flag.** Each iteration the ranks meet once, where Fig. 4
puts the synchronisation point before FP: a 1-element ``all_reduce(MAX)``
right after the batch is loaded. The time spent in it is T_w, the wait for
the slowest rank (§3.5: mostly data-loading skew, so measured where that
skew shows). The element is the rank's stop flag (SIGTERM seen), so every
rank learns in the same iteration that one of them was asked to stop, and
all stop after it: SIGTERMs reach the nodes of a job at different
iterations, and a rank that stopped alone would leave the others blocked in
DDP's next all-reduce. On CUDA the agreement runs on a gloo group of its
own (the flag lives on the host) after a device synchronisation, so that it
measures the ranks' skew rather than the host running ahead of the GPU.

**T_c.** A DDP communication hook wraps the gradient all-reduce of each
bucket and records when the first bucket was launched, the last bucket was
launched (backward's computation is then over) and the last bucket
finished. Measured on gloo only: NCCL completes futures when the work is
queued on the stream, so host timestamps would not time the transfer.
"""

# No ``from __future__ import annotations`` here: DDP checks a comm hook's
# ``bucket`` annotation against the GradBucket class, not its name.
import math
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: its functions take
# ``group=group.WORLD`` as a default argument, evaluated at import. Imported
# after init (DDP imports it), those defaults would hold the default group
# until the interpreter tears its modules down (see shutdown()).
import torch.distributed.nn.functional
from torch import nn
from torch._C._distributed_c10d import (  # = dist.GradBucket etc., which the stubs lack
    _DEFAULT_FIRST_BUCKET_BYTES,
    GradBucket,
    _compute_bucket_assignment_by_size,
)
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from hops.plugin.config import Settings


def init_group(settings: Settings, device: torch.device, timeout_s: float) -> None:
    """Join the job's default group (``MASTER_ADDR``/``MASTER_PORT`` from the
    environment): NCCL on CUDA, gloo on the CPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        rank=settings.rank,
        world_size=settings.world_size,
        timeout=timedelta(seconds=timeout_s),
    )


_MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25  # DistributedDataParallel's bucket_cap_mb default
BROADCAST_BUCKET_BYTES = 250 * _MIB  # and its buffer broadcast_bucket_size


def ddp_collectives(model: nn.Module, **ddp_kwargs: Any) -> tuple[int, int]:
    """(gradient all-reduces, buffer broadcasts) that one iteration of
    ``model`` issues under DistributedDataParallel with ``ddp_kwargs``.

    Counted without a process group, so that a one-process profile can tell
    the estimator what a data-parallel run would pay latency for. The
    buckets are DDP's once it has rebuilt them in the order gradients become
    ready (about the reverse of the parameters'), with its default caps: a
    small first bucket (1 MiB), then ``bucket_cap_mb`` (25 MiB). Buffers are
    broadcast from rank 0 before every forward pass unless
    ``broadcast_buffers=False``, in buckets of 250 MiB.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    caps = ddp_kwargs.get("bucket_cap_mb_list")
    cap_mb = ddp_kwargs.get("bucket_cap_mb")
    if caps:
        limits = [int(c * _MIB) for c in caps]
    elif cap_mb is None:
        limits = [_DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB * _MIB]
    else:
        limits = [int(cap_mb * _MIB)]
    buckets = 0
    if params:
        assignment, _ = _compute_bucket_assignment_by_size(
            list(reversed(params)), limits, [False] * len(params))
        buckets = len(assignment)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    broadcasts = 0
    if ddp_kwargs.get("broadcast_buffers", True) and buffer_bytes > 0:
        broadcasts = math.ceil(buffer_bytes / BROADCAST_BUCKET_BYTES)
    return buckets, broadcasts


class Agreement:
    """The per-iteration meeting: ``(anyone asked to stop, seconds waited)``."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        # A host-side flag needs a host-side group; gloo's default group is one.
        self._group = dist.new_group(backend="gloo") if self._cuda else None
        self._flag = torch.zeros(1)

    def __call__(self, stop: bool) -> tuple[bool, float]:
        if self._cuda:
            torch.cuda.synchronize()
        self._flag.fill_(1.0 if stop else 0.0)
        start = time.perf_counter()
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(self._flag.item() > 0.0), time.perf_counter() - start


class CommTimer:
    """Timestamps of one backward's bucket all-reduces (see the module doc).

    The completion callback runs on a gloo worker thread, hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: float | None = None
        self._last: float | None = None
        self._done: float | None = None

    def reset(self) -> None:
        with self._lock:
            self._first = self._last = self._done = None

    def launched(self) -> None:
        now = time.perf_counter()
        with self._lock:
            if self._first is None:
                self._first = now
            self._last = now

    def finished(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self._done = now

    def read(self) -> tuple[float | None, float | None]:
        """(span, exposed): first launch to last completion, and last launch
        to last completion; (None, None) when no bucket ran."""
        with self._lock:
            if self._first is None or self._last is None or self._done is None:
                return None, None
            return self._done - self._first, max(0.0, self._done - self._last)


def _timed_allreduce(
    timer: CommTimer, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (sum, divided by the world size), timed."""
    timer.launched()
    fut = default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

    def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        timer.finished()
        return f.value()

    return fut.then(done)


def wrap_ddp(
    model: nn.Module, device: torch.device, timer: CommTimer | None, **kwargs: object
) -> DistributedDataParallel:
    """``model`` in DistributedDataParallel, its all-reduce timed by ``timer``."""
    ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids, **kwargs)  # type: ignore[arg-type]
    if timer is not None:
        ddp.register_comm_hook(timer, _timed_allreduce)
    return ddp


def _detach(ddp: DistributedDataParallel) -> None:
    """Make a finished DDP wrapper let go of the process group: its reducer
    (and the logger sharing it) and its ``process_group``. The wrapped
    module, ``ddp.module``, stays usable; the wrapper no longer trains."""
    for name in ("reducer", "logger", "process_group"):
        if hasattr(ddp, name):
            delattr(ddp, name)


def shutdown(wrapped: list[DistributedDataParallel], meet: bool = True) -> None:
    """Leave the job's group so that the process exits with its own code.

    Why this order. A gloo worker thread drops its last reference to a
    finished collective a moment after the waiting rank moved on, and a
    collective launched in backward holds a Python object (the context
    autograd stashes in the thread's state, our hook's callback), so
    dropping it takes the GIL. If the interpreter is finalizing by then,
    CPython ends that thread with ``pthread_exit``, whose unwinding through a
    ``noexcept`` C++ frame calls ``std::terminate``: "terminate called
    without an active exception" and SIGABRT after a clean end. That is what
    happens when the group outlives ``main()``: the interpreter's teardown
    destroys it and joins its workers while holding the GIL. So:

    1. a barrier: every rank is done with every collective (``meet`` False
       skips it: after an error the other ranks may never come);
    2. the DDP wrappers let go of the group (``_detach``), and so do the
       defaults of ``torch.distributed.nn.functional`` (imported above,
       before the group existed);
    3. ``destroy_process_group`` drops the last reference: the group is
       destroyed now, with the GIL released, and joins its worker threads,
       which can still take the GIL to finish their releases. Nothing of
       gloo is left running when the interpreter finalizes.
    """
    if not dist.is_initialized():
        return
    try:
        if meet:
            dist.barrier()
    finally:
        for ddp in wrapped:
            _detach(ddp)
        wrapped.clear()
        dist.destroy_process_group()
