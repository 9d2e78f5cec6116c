"""Does running in lock step slow two CPU "devices" down? (docs/accuracy.md)

Two processes, pinned to cores 0 and 1 with one torch thread each, run the
loop body of ``examples/train_cnn.py`` (preprocess a batch of 32, forward,
backward, SGD update) without any torch.distributed: either free-running,
or meeting at a ``multiprocessing.Barrier`` once per iteration, as
DistributedDataParallel's ranks meet at their all-reduce. Each run reports
the median data and compute time per iteration of each process (after 10
warm-up iterations); the modes alternate, so that the host's drift falls
on both alike.

    .venv/bin/python -m bench.accuracy_lockstep --pairs 8   # about 4 minutes

Nothing here communicates, so a difference between the modes is what
doing the same phase at the same time on both cores costs on this host.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 10
BATCH = 32
DATASET = 4096


def _worker(rank: int, barrier: Barrier | None, iters: int,
            out: Queue[tuple[int, float, float]]) -> None:
    os.sched_setaffinity(0, {rank})
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "examples"))
    import train_cnn

    data = train_cnn.SyntheticImages(DATASET, 0)
    model = train_cnn.SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    times: list[tuple[float, float]] = []
    for i in range(iters):
        if barrier is not None:
            barrier.wait()
        t0 = time.perf_counter()
        batch = [data[(i * BATCH + k) % DATASET] for k in range(BATCH)]
        x = torch.stack([b[0] for b in batch])
        y = torch.tensor([b[1] for b in batch])
        t1 = time.perf_counter()
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append((t1 - t0, time.perf_counter() - t1))
    kept = times[WARMUP:]
    out.put((rank, statistics.median(a for a, _ in kept), statistics.median(b for _, b in kept)))


def run(lock: bool, iters: int) -> list[tuple[float, float]]:
    """(data, compute) median seconds per iteration of each of the two processes."""
    barrier = mp.Barrier(2) if lock else None
    out: Queue[tuple[int, float, float]] = mp.Queue()
    procs = [mp.Process(target=_worker, args=(r, barrier, iters, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return [(d, c) for _, d, c in results]


def _ms(values: list[float]) -> str:
    return (f"{1000 * statistics.fmean(values):.2f} ms "
            f"(sd {1000 * statistics.stdev(values):.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="free and lock-step runs each")
    parser.add_argument("--iters", type=int, default=150, help="iterations per run")
    args = parser.parse_args(argv)
    got: dict[str, list[tuple[float, float]]] = {"free": [], "lock step": []}
    for _ in range(args.pairs):
        for mode in got:
            got[mode] += run(mode == "lock step", args.iters)
            print(mode, " ".join(f"{1000 * d:.2f}/{1000 * c:.2f}" for d, c in got[mode][-2:]),
                  flush=True)
    for mode, values in got.items():
        data, compute = [d for d, _ in values], [c for _, c in values]
        print(f"{mode}: data {_ms(data)}, compute {_ms(compute)}, {len(values)} process runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
