"""Whether a trainer's copy of a round's parameters to the GPU waits for
another process's kernels (docs/hare.md §7, step 4d): the time of a
host-to-device copy of ``--mb`` MB (``train_lm``'s parameters are 1.36 MB)
in this process, with the GPU idle, while a second process keeps it busy
with matrix products (as the other trainer's task does), and while a
thread of this process does, on a stream of its own (as one process
holding both jobs would).

    PYTHONPATH=. python3 bench/gpu_copy_contention.py [--mb 1.36] [--copies 200]

Needs a GPU; prints p50 and p95 in ms for pageable and pinned sources.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from multiprocessing.synchronize import Event
from typing import Any

import torch

from bench.trainer_switch import percentile


def busy(started: Event, stop: Event) -> None:
    """Keep the GPU computing (back-to-back 4096² products) until ``stop``."""
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    started.set()
    while not stop.is_set():
        for _ in range(20):
            a = torch.mm(a, b).div_(4096)
        torch.cuda.synchronize()


def busy_here(started: threading.Event, stop: threading.Event) -> None:
    """:func:`busy` on a stream of this process."""
    with torch.cuda.stream(torch.cuda.Stream()):  # type: ignore[no-untyped-call]
        busy(started, stop)  # type: ignore[arg-type]


def copies(mb: float, count: int, pinned: bool) -> list[float]:
    """Seconds of each copy of ``mb`` MB to the GPU, on a side stream, until
    that stream is done."""
    src = torch.randn(int(mb * 1e6 / 4))
    if pinned:
        src = src.pin_memory()
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # its own stream
    out = []
    with torch.cuda.stream(side):
        for _ in range(count):
            start = time.monotonic()
            src.to("cuda", non_blocking=pinned)
            side.synchronize()
            out.append(time.monotonic() - start)
            time.sleep(0.002)
    return out


def report(label: str, mb: float, count: int) -> None:
    """One line per source (pageable, pinned): p50 and p95 in ms."""
    for pinned in (False, True):
        took = copies(mb, count, pinned)
        print(f"{label:8} {'pinned' if pinned else 'pageable':9} "
              f"{percentile(took, 0.5) * 1e3:8.3f} {percentile(took, 0.95) * 1e3:8.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=1.36)
    parser.add_argument("--copies", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU here", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")  # the context, before anything is timed
    print(f"{'GPU':8} {'source':9} {'p50 ms':>8} {'p95 ms':>8}")
    report("idle", args.mb, args.copies)
    ctx = mp.get_context("spawn")
    other = (ctx.Event(), ctx.Event())
    here = (threading.Event(), threading.Event())
    workers: list[tuple[str, Any, Any]] = [
        ("busy", ctx.Process(target=busy, args=other), other),
        ("thread", threading.Thread(target=busy_here, args=here), here)]
    for label, worker, (started, stop) in workers:
        worker.start()
        try:
            started.wait(60)
            report(label, args.mb, args.copies)
        finally:
            stop.set()
            worker.join(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
