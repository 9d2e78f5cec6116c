"""One iteration of a run under the plugin, timed phase by phase (Hops §3.2).

:class:`Step` is what :meth:`hops.plugin.run.Run.steps` yields: the script
wraps the iteration's phases in its context managers (T_d, T_f, T_b, T_u)
and the ranks meet once per step (T_w). It stands apart from the run's
lifecycle in :mod:`hops.plugin.run`, which builds one per iteration and
reads its times when the iteration ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from torch.nn.parallel import DistributedDataParallel

from hops.plugin.config import Settings
from hops.plugin.data import DataClock
from hops.plugin.dist import CommTimer
from hops.plugin.measure import IterationTimes
from hops.plugin.micro import MicroBatch, micro_batches


class Run(Protocol):
    """What a step reads and calls of :class:`hops.plugin.run.Run`. Named by
    its shape so that the run can build steps without the two modules
    importing each other."""

    @property
    def settings(self) -> Settings: ...
    @property
    def _clock(self) -> DataClock: ...  # the data loader's production time
    @property
    def _comm_timer(self) -> CommTimer | None: ...  # DDP's all-reduce, once wrapped
    @property
    def _wrapped(self) -> Sequence[DistributedDataParallel]: ...
    def _device_sync(self) -> None: ...
    def _agree(self, step: Step) -> None: ...


class Step:
    """One iteration. Wrap its phases in the context managers; each may be
    entered several times (gradient accumulation: :meth:`micro_batches`)
    and the times add up."""

    def __init__(self, run: Run, index: int, samples: float) -> None:
        self.index = index  # iterations before this one, in this run
        self.samples = samples  # what it adds to the job's progress (the last may count less)
        self._run = run
        self._t: dict[str, float] = dict.fromkeys(("data", "forward", "backward", "update"), 0.0)
        self._production: float | None = None
        self._comm: tuple[float | None, float | None] = (None, None)
        self.wait = 0.0  # T_w, once the ranks met
        self.agreed = False

    @contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self._run._device_sync()
        self._t[phase] += time.perf_counter() - start

    @contextmanager
    def data(self) -> Iterator[None]:
        """Getting the batch (T_d); the ranks meet right after it (T_w)."""
        with self._timed("data"):
            yield
        produced = self._run._clock.take()
        if produced is not None:
            self._production = (self._production or 0.0) + produced
        self._run._agree(self)

    @contextmanager
    def forward(self) -> Iterator[None]:
        """The forward pass (T_f)."""
        self._run._agree(self)  # a loop without step.data() meets here
        with self._timed("forward"):
            yield

    @contextmanager
    def backward(self) -> Iterator[None]:
        """The backward pass (T_b), with DDP's gradient all-reduce in it."""
        timer = self._run._comm_timer
        if timer is not None:
            timer.reset()
        with self._timed("backward"):
            yield
        if timer is not None:
            self._comm = timer.read()

    def micro_batches(self) -> Iterator[MicroBatch]:
        """This rank's micro-batches of the step (one unless relaxed-sync,
        :mod:`hops.plugin.micro`): load, forward, ``micro.scale(loss)``, backward."""
        return micro_batches(self._run.settings, self._run._wrapped)

    @contextmanager
    def update(self) -> Iterator[None]:
        """The optimizer step (T_u)."""
        with self._timed("update"):
            yield

    def times(self, total: float) -> IterationTimes:
        t = self._t
        return IterationTimes(
            data_wait=t["data"], production=self._production, forward=t["forward"],
            backward=t["backward"], update=t["update"], sync_wait=self.wait,
            comm=self._comm[0], comm_exposed=self._comm[1], total=total)
