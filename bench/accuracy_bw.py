"""This host's gloo all-reduce latency and bandwidth, for Eq. (2) (seconds,
parameters/s).

Two processes, each pinned to one core with one torch thread, join a gloo
group over loopback and time ``all_reduce`` of fp32 tensors of known sizes
(65 k to 2.1 M: around the examples' parameter counts, 114 k and 339 k, and
DDP's 1 MiB first bucket, and wide enough that the time per parameter
stands out of the latency's noise; over 98 k to 393 k alone the fitted slope
sometimes came out negative): a barrier, then the timed collective,
repeated after a warm-up. On this host a
collective takes either a fraction of a millisecond or some 3 ms more, at
random (a wake-up of the other virtual CPU, it seems), so the *mean* is
used: Eq. (4) wants the expected iteration time, and a median would flip
between the two modes from one measurement to the next.

The mean times are fitted by least squares with a latency and a time per
parameter, T(p) ≈ α + k·p (the alpha-beta model; α clamped at >= 0, i.e.
fitted through the origin when the free intercept comes out negative).
Eq. (2) itself has no latency term; the GPU type's ``link_latency_s`` and
``net_latency_s`` add α to it (:class:`shared.cluster.GpuTypeSpec`). For
N = 2 processes Eq. (2) then reads T_c = α + params·(N-1)/N / B_link on one
node and T_c = α + params/B_net across nodes; the same measured times give
B_link = (N-1)/N / k, B_net = 1/k and both latencies α. Both "servers" of
the study are this host, so the two differ only by Eq. (2)'s factor, not by
the link.

Run as a module, this file is one of the two measuring processes::

    python -m bench.accuracy_bw RANK PORT SIZE[,SIZE...] REPS

and :func:`measure` runs both (``python -c "from bench import accuracy_bw as
b; print(b.measure((113_738, 338_944), 30))"`` for the examples' sizes).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, ServerId

ROOT = Path(__file__).resolve().parents[1]
SIZES = (65_536, 131_072, 262_144, 524_288, 1_048_576, 2_097_152)
REPS = 100
WARMUP = 10
PROCESSES = 2
# A CPU core both computes the backward pass and runs gloo's reduction and
# copies, so none of the all-reduce hides behind BP: T̃c = T_c in Eq. (1).
CPU_OVERLAP_RESIDUAL = 1.0


@dataclass(frozen=True)
class Bandwidth:
    """Measured all-reduce means (seconds per size), their 10th, 50th and
    90th percentiles, and the fit T(p) = ``latency_s`` + ``seconds_per_param``·p."""

    times: dict[int, float]
    spread: dict[int, tuple[float, float, float]]
    seconds_per_param: float
    latency_s: float = 0.0

    @property
    def link(self) -> float:
        """B_link of Eq. (2) for N = 2 on one node."""
        return (PROCESSES - 1) / PROCESSES / self.seconds_per_param

    @property
    def net(self) -> float:
        """B_net of Eq. (2) across nodes."""
        return 1.0 / self.seconds_per_param


def fit_latency_and_slope(times: dict[int, float]) -> tuple[float, float]:
    """(α, k) of T(p) = α + k·p by least squares over ``times`` (size →
    mean seconds), with α >= 0: when the free intercept is negative the
    constraint binds and the fit goes through the origin, k = Σp·T / Σp².
    One size alone gives no intercept either. ValueError when the time does
    not grow with the size (no bandwidth can be fitted)."""
    points = [(float(p), t) for p, t in times.items()]
    if not points:
        raise ValueError("no all-reduce time measured")
    mean_p = sum(p for p, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    sxx = sum((p - mean_p) ** 2 for p, _ in points)
    sxy = sum((p - mean_p) * (t - mean_t) for p, t in points)
    if sxx > 0 and mean_t - sxy / sxx * mean_p >= 0:
        slope = sxy / sxx
        alpha = mean_t - slope * mean_p
    else:
        alpha, slope = 0.0, sum(p * t for p, t in points) / sum(p * p for p, _ in points)
    if slope <= 0:
        raise ValueError(
            f"all-reduce time does not grow with size ({times}): no bandwidth to fit; "
            "measure again with more repetitions or a wider range of sizes"
        )
    return alpha, slope


def measure(sizes: tuple[int, ...] = SIZES, reps: int = REPS, timeout_s: float = 300) -> Bandwidth:
    """Run the two pinned processes and fit Eq. (2)'s bandwidths and latency."""
    # Imported here, not at the top: the two workers run this module too.
    from cli.up.launcher import free_port

    port = free_port()
    arg = ",".join(map(str, sizes))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.accuracy_bw", str(rank), str(port), arg, str(reps)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        for rank in range(PROCESSES)
    ]
    outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"all-reduce measurement failed: {[p.returncode for p in procs]}")
    # Rank 0's times: after the barrier both ranks are in the collective.
    raw = {int(k): v for k, v in json.loads(outputs[0]).items()}
    times = {size: statistics.fmean(raw[size]) for size in sizes}
    spread = {size: _percentiles(raw[size]) for size in sizes}
    alpha, slope = fit_latency_and_slope(times)
    return Bandwidth(times, spread, slope, alpha)


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    deciles = statistics.quantiles(values, n=10)
    return deciles[0], statistics.median(values), deciles[-1]


def cluster_of(bw: Bandwidth) -> Cluster:
    """The study's cluster: node-a with 2 CPU "GPUs", node-b with 1, with the
    fitted latency and bandwidths and no overlap of communication with BP."""
    cpu = GpuType("cpu")
    latency = round(bw.latency_s, 6)  # to the microsecond: far below the spread
    spec = GpuTypeSpec(cpu, link_bandwidth=round(bw.link), net_bandwidth=round(bw.net),
                       overlap_residual=CPU_OVERLAP_RESIDUAL, link_latency_s=latency,
                       net_latency_s=latency)
    return Cluster(
        gpu_types=(spec,),
        servers=(Server(ServerId("node-a"), cpu, 2, cpu="core 0 | core 1"),
                 Server(ServerId("node-b"), cpu, 1, cpu="core 1")),
        name="accuracy-cpu",
    )


def write_cluster(cluster: Cluster, path: Path) -> Path:
    """The cluster spec file the executors load (JSON)."""
    path.write_bytes(msgspec.json.format(msgspec.json.encode(cluster)))
    return path


def _worker(rank: int, port: int, sizes: list[int], reps: int) -> dict[int, list[float]]:
    """One measuring process: pinned, one thread, gloo over loopback."""
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=PROCESSES)
    measured: dict[int, list[float]] = {}
    try:
        for size in sizes:
            tensor = torch.ones(size)
            for _ in range(WARMUP):
                dist.all_reduce(tensor)
            times = []
            for _ in range(reps):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                times.append(time.perf_counter() - start)
            measured[size] = times
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return measured


if __name__ == "__main__":
    _rank, _port, _sizes, _reps = sys.argv[1:5]
    result = _worker(int(_rank), int(_port), [int(s) for s in _sizes.split(",")], int(_reps))
    print(json.dumps(result))
