"""PNG plots of a set of simulation runs: CDFs of JCT and latency ratio, and
cluster throughput over time (Hops Figures 9, 11 and 12)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

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
