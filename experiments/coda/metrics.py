"""The metrics of the CODA experiment (issue 21; CODA §VI-B, §VI-C), pure.

* ``gpu_util``: GPU time spent busy over GPU time held by GPU jobs; a GPU is
  busy the share of its held time its job's cores let it be
  (:func:`world.cores.core_factor`), less restarts (CODA's Figure 10
  "GPU utilisation").
* ``gpu_active``: GPUs held over all GPUs, averaged over the rounds in
  which jobs queued (Figure 10's "GPU active rate").
* ``idle_gpus_for_cores``: the mean share of the cluster's GPUs idle with
  no free core beside them, over the rounds in which a GPU job waited
  (§VI-C's first kind of fragmentation).
* CPU jobs' waits: mean, p95 and the share under 3 minutes (§VI-C: 94.5%
  under CODA); GPU and CPU jobs' mean JCT; in-place core changes per GPU job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.cluster import Cluster
from simulator.metrics import SimResult, percentile

# CODA §VI-B/C: FIFO, DRF and CODA (the paper has no fixed-cores run).
PAPER: dict[str, dict[str, float]] = {
    "fifo": {"gpu_util": 0.454, "gpu_active": 0.835, "idle_gpus_for_cores": 0.143},
    "drf": {"gpu_util": 0.447, "gpu_active": 0.833, "idle_gpus_for_cores": 0.146},
    "coda": {"gpu_util": 0.621, "gpu_active": 0.912, "idle_gpus_for_cores": 0.01,
             "cpu_wait_under_3min": 0.945},
}


def coda_metrics(result: SimResult, cluster: Cluster) -> dict[str, float]:
    gpu = [j for j in result.jobs if j.kind != "cpu"]
    cpu = [j for j in result.jobs if j.kind == "cpu"]
    held = sum(j.held_gpu_s for j in gpu)
    waits = [j.wait_s for j in cpu if j.first_start is not None]
    gpu_jct = [j.jct_s for j in gpu if j.jct_s is not None]
    cpu_jct = [j.jct_s for j in cpu if j.jct_s is not None]
    waiting = [r for r in result.rounds if r.short_of_cores or r.waiting]
    queued = [r for r in result.rounds if r.waiting]
    total = cluster.total_gpus or 1
    return {
        "gpu_util": sum(j.busy_gpu_s for j in gpu) / held if held else 0.0,
        # Figure 10's active rate: GPUs held over all GPUs while jobs queue.
        "gpu_active": (sum(1 - r.idle / total for r in queued) / len(queued)
                       if queued else 0.0),
        "idle_gpus_for_cores": (sum(r.short_of_cores for r in waiting) / len(waiting) / total
                                if waiting else 0.0),
        "cpu_wait_avg_h": sum(waits) / len(waits) / 3600 if waits else 0.0,
        "cpu_wait_p95_h": percentile(waits, 95) / 3600,
        "cpu_wait_under_3min": sum(1 for w in waits if w < 180) / len(waits) if waits else 0.0,
        "gpu_jct_avg_h": sum(gpu_jct) / len(gpu_jct) / 3600 if gpu_jct else 0.0,
        "cpu_jct_avg_h": sum(cpu_jct) / len(cpu_jct) / 3600 if cpu_jct else 0.0,
        "core_changes_per_gpu_job": sum(j.retunes for j in gpu) / len(gpu) if gpu else 0.0,
        "gpu_jobs_finished": float(len(gpu_jct)),
        "cpu_jobs_finished": float(len(cpu_jct)),
        "makespan_h": result.end_time / 3600,
    }


def table(results: Mapping[str, Mapping[str, float]], paper: Mapping[str, Mapping[str, float]],
          setup: Mapping[str, Any]) -> str:
    """results.md: every metric per policy, the paper's beside where it has one."""
    keys = sorted({k for r in results.values() for k in r})
    lines = ["# CODA experiment", "",
             "Setup: " + ", ".join(f"{k}={v}" for k, v in setup.items() if k != "cluster"), "",
             "| metric | " + " | ".join(results) + " |",
             "| --- |" + " --- |" * len(results)]
    for k in keys:
        cells = []
        for name, r in results.items():
            ref = paper.get(name, {}).get(k)
            beside = f" (paper {ref:.3f})" if ref is not None else ""
            cells.append(f"{r.get(k, 0.0):.3f}{beside}")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
