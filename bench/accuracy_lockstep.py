"""What slows two CPU "devices" down under data parallelism? (docs/accuracy.md)

Two processes, pinned to cores 0 and 1 with one torch thread each, run the
loop body of ``examples/train_cnn.py`` (preprocess a batch of 32, forward,
backward, SGD update) in one of four modes, which add one ingredient of a
DistributedDataParallel run at a time:

- ``free``: nothing shared, as two independent jobs;
- ``barrier``: the two meet at a ``multiprocessing.Barrier`` once per
  iteration (lock step, no torch.distributed);
- ``gloo``: they meet in a 1-element gloo ``all_reduce`` instead, as the
  plugin's per-iteration agreement does (a process group, its threads);
- ``ddp``: that, and the model in DistributedDataParallel (its gradient
  all-reduce inside backward);
- ``ddp-view``: the same with ``gradient_as_bucket_view=True`` (gradients
  live in DDP's buckets instead of being copied into them).

Each run reports the median data (before the meeting), forward and
backward-plus-update time per iteration of each process (after 10 warm-up
iterations); the modes take turns, so that the host's drift falls on all
alike. Preprocessing and the
forward pass communicate in no mode, so their times compare directly;
backward includes DDP's all-reduce in the ``ddp`` modes only.

    .venv/bin/python -m bench.accuracy_lockstep --rounds 6   # about 6 minutes
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

from bench.accuracy_bw import ROOT, free_port

WARMUP = 10
BATCH = 32
DATASET = 4096
MODES = ("free", "barrier", "gloo", "ddp", "ddp-view")
PHASES = ("data", "forward", "backward+update")

Times = tuple[float, float, float]


def _worker(rank: int, mode: str, barrier: Barrier, port: int, iters: int,
            out: Queue[tuple[int, Times | str]]) -> None:
    try:
        out.put((rank, _loop(rank, mode, barrier, port, iters)))
    except Exception as e:  # the parent reports it and ends the run
        out.put((rank, f"{type(e).__name__}: {e}"))


def _loop(rank: int, mode: str, barrier: Barrier, port: int, iters: int) -> Times:
    os.sched_setaffinity(0, {rank})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "examples"))
    import train_cnn

    torch.manual_seed(0)
    model: torch.nn.Module = train_cnn.SmallCNN()
    flag = torch.zeros(1)
    if mode != "free" and mode != "barrier":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2,
                                timeout=timedelta(seconds=60))
        if mode.startswith("ddp"):
            model = torch.nn.parallel.DistributedDataParallel(
                model, gradient_as_bucket_view=mode == "ddp-view")
    data = train_cnn.SyntheticImages(DATASET, rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    times: list[Times] = []
    for i in range(iters):
        t0 = time.perf_counter()
        batch = [data[(i * BATCH + k) % DATASET] for k in range(BATCH)]
        x = torch.stack([b[0] for b in batch])
        y = torch.tensor([b[1] for b in batch])
        tm = time.perf_counter()
        if mode == "barrier":
            barrier.wait()
        elif mode != "free":
            dist.all_reduce(flag)
        t1 = time.perf_counter()
        loss = loss_fn(model(x), y)
        t2 = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append((tm - t0, t2 - t1, time.perf_counter() - t2))
    # DDP's reducer must go before its group does, or its destructor waits
    # on a group that no longer exists.
    del model, optimizer
    if dist.is_initialized():
        dist.destroy_process_group()
    kept = times[WARMUP:]
    data, forward, backward = (statistics.median(t[k] for t in kept) for k in range(3))
    return data, forward, backward


def run(mode: str, iters: int) -> list[Times]:
    """(data, forward, backward+update) median seconds per iteration of each
    of the two processes."""
    barrier = mp.Barrier(2)
    out: Queue[tuple[int, Times | str]] = mp.Queue()
    port = free_port()
    procs = [mp.Process(target=_worker, args=(r, mode, barrier, port, iters, out))
             for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():  # its peer failed; it would wait for it for a minute
                p.kill()
    failed = [f"rank {rank}: {r}" for rank, r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"{mode} run failed: {'; '.join(failed)}")
    return [r for _, r in results if not isinstance(r, str)]


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.fmean(values):.2f} (sd {1000 * statistics.stdev(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="runs of every mode")
    parser.add_argument("--iters", type=int, default=150, help="iterations per run")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    got: dict[str, list[Times]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            got[mode] += run(mode, args.iters)
            print(mode, " ".join("/".join(f"{1000 * v:.2f}" for v in t) for t in got[mode][-2:]),
                  flush=True)
    print(f"means over {2 * args.rounds} process runs, ms per iteration (sd):")
    for mode, values in got.items():
        print(f"  {mode:8} " + ", ".join(f"{name} {_ms([t[k] for t in values])}"
                                         for k, name in enumerate(PHASES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
