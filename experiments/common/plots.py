"""PNG plots of a set of simulation runs: CDFs of JCT and latency ratio, and
cluster throughput over time (Hops Figures 9, 11 and 12)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.metrics import SimResult


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def plot_results(name: str, results: Mapping[str, SimResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    panels: tuple[tuple[str, str, Callable[[SimResult], list[float]]], ...] = (
        ("jct_cdf.png", "JCT (h)", lambda r: [j.jct_s / 3600 for j in r.jobs if j.jct_s]),
        ("lr_cdf.png", "latency ratio", lambda r: [j.lr for j in r.jobs if j.finish is not None]),
    )
    for filename, xlabel, pick in panels:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, result in results.items():
            values = pick(result)
            if values:
                xs, ys = _cdf(values)
                ax.step(xs, ys, where="post", label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("CDF")
        ax.set_title(f"{name}: CDF of {xlabel}")
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / filename, dpi=110)
        plt.close(fig)
        written.append(out / filename)
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, result in results.items():
        ax.plot([r.t / 3600 for r in result.rounds], [r.throughput for r in result.rounds],
                label=label, linewidth=1)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("cluster throughput (samples/s)")
    ax.set_title(f"{name}: cluster throughput")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    written.append(out / "throughput.png")
    return written


def _finish(fig: Any, ax: Any, path: Path) -> None:
    """Legend, layout, write ``path`` and free the figure."""
    import matplotlib.pyplot as plt

    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sharing(results: Mapping[str, Mapping[str, Any]],
                 fragmentation: Mapping[str, Sequence[tuple[float, float]]],
                 out: Path) -> list[Path]:
    """The sharing experiment (issue 20): each tenant's average wait under
    each policy (grouped bars, HiveD Figure 7's view) and the fragmentation
    level over time (Figure 6's bottom panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(results)
    tenants = sorted({t for e in results.values() for t in e["tenants"]})
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(tenants)), 4))
    for i, label in enumerate(labels):
        waits = [results[label]["tenants"].get(t, {}).get("avg_wait_h", 0.0) for t in tenants]
        ax.bar([k + i * width for k in range(len(tenants))], waits, width, label=label)
    ax.set_xticks([k + width * (len(labels) - 1) / 2 for k in range(len(tenants))], tenants)
    ax.set_ylabel("average wait (h)")
    ax.set_title("sharing: average wait per tenant")
    _finish(fig, ax, out / "tenant_wait.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, series in fragmentation.items():
        ax.plot([t / 86400 for t, _ in series], [f for _, f in series], label=label, linewidth=1)
    ax.set_xlabel("time (days)")
    ax.set_ylabel("node cells that cannot host an 8-GPU job")
    ax.set_title("sharing: fragmentation level")
    _finish(fig, ax, out / "fragmentation.png")
    return [out / "tenant_wait.png", out / "fragmentation.png"]


def cdf_plot(series: Mapping[str, Sequence[float]], xlabel: str, path: Path) -> Path:
    """One CDF per labelled series (CODA's Figure 11)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in series.items():
        if values:
            xs, ys = _cdf(list(values))
            ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("CDF")
    _finish(fig, ax, path)
    return path
