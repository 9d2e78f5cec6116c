"""Which CPU cores a job gets on its node (pure, but for NVML's answers).

An executor that pins jobs (a real one without ``--cpu-affinity``) holds a
*pool*: the core ids it may use, ``os.sched_getaffinity(0)`` when it
starts. A job holding N cores on the server gets N ids of the pool that no
other job there holds (:func:`choose_cores`):

* the lowest free ids, so that jobs pack from one end and a large job finds
  a contiguous run at the other;
* first among the cores *near* the job's GPUs (the NUMA node NVML names for
  them, :class:`NvmlTopology`), since a data loader that feeds a GPU from
  the far socket pays the interconnect on every batch; then any free core;
* on a change of count (``set_cores``), the cores the job already holds
  first, so that a shrink keeps its warm caches and a growth only adds.

Without NVML (no ``pynvml``, no driver, or no GPU: a CPU job) every core is
as near as any other (:class:`NoTopology`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Collection, Iterable
from typing import Any, Protocol

import msgspec

from shared.events import StartJob
from shared.resources import Resources

_WORD_BITS = 64  # NVML's CPU sets are arrays of unsigned longs


class CoreShortage(ValueError):
    """Fewer free cores in the pool than a job needs."""


class Topology(Protocol):
    """Which cores are near a set of GPUs."""

    def near(self, gpu_indices: tuple[int, ...]) -> frozenset[int]:
        """The cores near every one of ``gpu_indices`` (empty: none known)."""


class NoTopology:
    """Nothing is known: no core is preferred."""

    def near(self, gpu_indices: tuple[int, ...]) -> frozenset[int]:
        return frozenset()


def choose_cores(count: int, pool: Collection[int], taken: Collection[int],
                 near: Collection[int] = (), keep: Iterable[int] = ()) -> tuple[int, ...]:
    """``count`` distinct core ids of ``pool`` not in ``taken`` (see the
    module): those of ``keep`` still free first, then the lowest of ``near``,
    then the lowest of the rest; sorted. :class:`CoreShortage` when the
    pool has fewer than ``count`` free."""
    if count <= 0:
        return ()
    free = sorted(set(pool) - set(taken))
    if len(free) < count:
        raise CoreShortage(f"{len(free)} of this executor's cores {_span(pool)} are free, "
                           f"{count} needed")
    kept = [c for c in sorted(set(keep)) if c in free][:count]
    rest = [c for c in free if c not in kept]
    close = [c for c in rest if c in near]
    far = [c for c in rest if c not in near]
    return tuple(sorted((kept + close + far)[:count]))


def _span(cores: Iterable[int]) -> str:
    """``[0-3, 6]``: a core set, short."""
    ids = sorted(set(cores))
    runs: list[str] = []
    start = prev = None
    for c in [*ids, None]:
        if c is not None and prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = c
    return "[" + ", ".join(runs) + "]"


def mask_cores(words: Iterable[int]) -> frozenset[int]:
    """The core ids set in an NVML CPU set (word 0 holds cores 0-63)."""
    out: set[int] = set()
    for w, word in enumerate(words):
        out.update(w * _WORD_BITS + b for b in range(_WORD_BITS) if int(word) >> b & 1)
    return frozenset(out)


class NvmlTopology:
    """The cores NVML calls ideal for each GPU (its NUMA node's), read once
    per GPU; a GPU NVML cannot answer for counts as near to nothing."""

    def __init__(self, nvml: Any, cpu_count: int) -> None:
        self.nvml = nvml
        self.words = max(1, -(-cpu_count // _WORD_BITS))
        self._near: dict[int, frozenset[int]] = {}

    def _of(self, index: int) -> frozenset[int]:
        if index not in self._near:
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                self._near[index] = mask_cores(self.nvml.nvmlDeviceGetCpuAffinity(handle,
                                                                                 self.words))
            except self.nvml.NVMLError:
                self._near[index] = frozenset()
        return self._near[index]

    def near(self, gpu_indices: tuple[int, ...]) -> frozenset[int]:
        if not gpu_indices:
            return frozenset()
        sets = [self._of(i) for i in gpu_indices]
        common = frozenset.intersection(*sets)
        # GPUs on two sockets share no core: prefer either socket's over none.
        return common or frozenset().union(*sets)


def core_pool(real: bool, operator_affinity: bool) -> frozenset[int] | None:
    """The cores an executor pins jobs to: its own affinity, for a real
    executor given no ``--cpu-affinity`` (an operator's cores win); else
    None, no pinning (emulated jobs train nothing, and emulated executors
    share one host)."""
    return frozenset(os.sched_getaffinity(0)) if real and not operator_affinity else None


def load_topology(cpu_count: int) -> Topology:
    """NVML's topology when it answers (a GPU machine), else :class:`NoTopology`."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # no pynvml, no library or no driver: nothing to prefer
        return NoTopology()
    with contextlib.suppress(Exception):
        if int(nvml.nvmlDeviceGetCount()) > 0:
            return NvmlTopology(nvml, cpu_count)
    return NoTopology()


def with_cores(cmd: StartJob, count: int) -> StartJob:
    """``cmd`` as if it had started its job holding ``count`` cores on its
    server (its other resources and servers unchanged): what a running job
    holds after a ``set_cores``, as the executor keeps it."""
    config = cmd.configuration
    extras = {s: Resources(cores=count if s == cmd.server_id else d.cores,
                           memory_mb=d.memory_mb)
              for s, d in ((s, config.demand_on(s)) for s in config.servers)}
    return msgspec.structs.replace(cmd, configuration=config.with_extras(extras))
