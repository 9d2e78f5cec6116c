"""Loaders that tell the plugin how long a batch took to make (Hops §3.5).

Eq. (1)'s T_d is a batch's production time, which the main loop cannot see
when a loader prepares batches in the background: there it only sees its
wait for the next batch. Comparing the two is how the plugin tells the
patterns of Eq. (1) apart (:func:`hops.plugin.measure.detect_pattern`).

- :func:`make_loader` builds a ``torch.utils.data.DataLoader`` over a
  map-style dataset whose batches carry their production time: the dataset
  wrapper times fetching the batch's samples (``__getitems__``, in whichever
  process builds the batch, worker or main) and the collate wrapper adds
  its own time and returns a :class:`TimedBatch`;
- :class:`MicroBatchSampler` gives a relaxed-sync rank its micro-batches'
  samples (hare.md §2.2.3): each step's S per-GPU batches are those S
  replicas of a DistributedSampler would read, whatever the ranks' shares;
- :class:`TimedLoader` iterates endlessly over epochs, unwraps those batches
  and records their production time (divided by the number of workers
  that produce side by side: the loader's rate is what T_d stands for); for
  a plain iterable it times ``next()`` itself, as a serial loader's
  production happens right there.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data.dataloader import default_collate

from hops.plugin.config import Settings

B = TypeVar("B")


class DataClock:
    """Production times of the batches handed out since the loop last asked."""

    def __init__(self) -> None:
        self._pending: list[float] = []

    def record(self, seconds: float) -> None:
        self._pending.append(seconds)

    def take(self) -> float | None:
        """The sum of what was recorded since the last take (None: nothing)."""
        if not self._pending:
            return None
        total = sum(self._pending)
        self._pending.clear()
        return total


class TimedBatch(NamedTuple):
    """A batch and the seconds it took to make (fetch and collate)."""

    batch: Any
    seconds: float


class _TimedItems(list[Any]):
    """The samples of one batch, with the time fetching them took."""

    seconds: float = 0.0


class TimedDataset(Dataset[Any]):
    """A map-style dataset whose batch fetches are timed (for :class:`TimedCollate`)."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> _TimedItems:
        start = time.perf_counter()
        inner = getattr(self.dataset, "__getitems__", None)
        items = _TimedItems(inner(indices) if inner else [self.dataset[i] for i in indices])
        items.seconds = time.perf_counter() - start
        return items


class TimedCollate:
    """Collates with ``collate`` (default: torch's) and returns a
    :class:`TimedBatch` with fetch plus collate time."""

    def __init__(self, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.collate = collate or default_collate

    def __call__(self, items: list[Any]) -> TimedBatch:
        start = time.perf_counter()
        batch = self.collate(items)
        return TimedBatch(batch, getattr(items, "seconds", 0.0) + time.perf_counter() - start)


class _WorkerInit:
    """Loader workers ignore SIGTERM: the executor signals the job's whole
    process group, and a worker killed by it would make the main loop fail
    instead of checkpointing; the main process ends its workers itself."""

    def __init__(self, user: Callable[[int], None] | None) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.user is not None:
            self.user(worker_id)


class TimedLoader(Generic[B]):
    """An endless iterator over ``source``'s batches that records their
    production time into ``clock`` (see the module doc)."""

    def __init__(self, source: Iterable[B], clock: DataClock, parallelism: int = 1) -> None:
        self.source = source
        self.clock = clock
        self.parallelism = max(1, parallelism)
        self.epoch = 0
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> TimedLoader[B]:
        return self

    def __next__(self) -> B:
        start = time.perf_counter()
        item = self._next_item()
        if isinstance(item, TimedBatch):
            self.clock.record(item.seconds / self.parallelism)
            return item.batch  # type: ignore[no-any-return]
        self.clock.record(time.perf_counter() - start)
        return item  # type: ignore[no-any-return]

    def _next_item(self) -> Any:
        if self._it is None:
            self._it = iter(self.source)
        try:
            return next(self._it)
        except StopIteration:
            if isinstance(self.source, Iterator):
                raise  # a one-shot iterator is used up: so is the loader
        self.epoch += 1
        sampler = getattr(self.source, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(self.epoch)  # a new shuffle each epoch, the same on every rank
        self._it = iter(self.source)
        return next(self._it)


class MicroBatchSampler(DistributedSampler[Any]):
    """Indices for a rank that processes ``count`` of a step's
    ``num_replicas`` (the sync scale S) per-GPU batches, from batch
    ``rank`` (its first micro-batch's index) on.

    The epoch's order is DistributedSampler's (seed + epoch, the tail
    dropped) dealt out to S virtual replicas; step t's micro-batches of this
    rank are batch t of each of its replicas, one after the other. So every
    rank runs the same number of steps per epoch, each step reads S disjoint
    batches over all ranks, and an epoch reads each kept sample once,
    however the ranks share the S batches.
    """

    def __init__(self, dataset: Dataset[Any], sync_scale: int, first: int, count: int,
                 batch_size: int, *, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=sync_scale, rank=first, shuffle=shuffle,
                         seed=seed, drop_last=True)
        if count < 1 or first + count > sync_scale or batch_size < 1:
            raise ValueError(f"micro-batches {first}..{first + count - 1} of {sync_scale} "
                             f"at batch size {batch_size}")
        self.count = count
        self.batch_size = batch_size
        self.steps = self.num_samples // batch_size

    def __iter__(self) -> Iterator[int]:
        size = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order: list[int] = torch.randperm(size, generator=g).tolist()
        else:
            order = list(range(size))
        total, stride = self.total_size, self.num_replicas
        shards = [order[j:total:stride] for j in range(self.rank, self.rank + self.count)]
        b = self.batch_size
        for t in range(self.steps):
            for shard in shards:
                yield from shard[t * b:(t + 1) * b]

    def __len__(self) -> int:
        return self.steps * self.count * self.batch_size


def make_loader(
    dataset: Dataset[Any],
    settings: Settings,
    clock: DataClock,
    batch_size: int | None = None,
    *,
    shuffle: bool = True,
    num_workers: int = 0,
    seed: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
    **kwargs: Any,
) -> TimedLoader[Any]:
    """A timed DataLoader over ``dataset``; with several ranks each reads
    its own shard (DistributedSampler), reshuffled each epoch; a
    relaxed-sync rank its micro-batches' (:class:`MicroBatchSampler`)."""
    sampler: DistributedSampler[Any] | None = None
    generator = None
    size = batch_size or settings.batch_size
    if settings.relaxed:
        sampler = MicroBatchSampler(dataset, settings.sync_scale, settings.first_micro_batch,
                                    settings.own_micro_batches, size, shuffle=shuffle,
                                    seed=seed)
    elif settings.distributed:
        sampler = DistributedSampler(dataset, num_replicas=settings.world_size,
                                     rank=settings.rank, shuffle=shuffle, seed=seed,
                                     drop_last=True)
    elif shuffle:
        generator = torch.Generator().manual_seed(seed)
    loader: DataLoader[Any] = DataLoader(
        TimedDataset(dataset),
        batch_size=size,
        shuffle=shuffle and sampler is None,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=TimedCollate(collate_fn),
        worker_init_fn=_WorkerInit(worker_init_fn),
        persistent_workers=num_workers > 0,  # no re-fork at each epoch
        drop_last=True,
        generator=generator,
        **kwargs,
    )
    return TimedLoader(loader, clock, parallelism=num_workers)
