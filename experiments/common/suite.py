"""A named list of simulation runs and its outputs (Hops §4.2-4.6).

``run_experiment`` executes the runs (one after another, or at once where
its pool says: ``hops experiment --workers``, ``--ray``), then writes ``results.json`` (one
summary per run), ``results.md`` (a table, beside the paper's numbers when
the experiment has them) and PNG plots (CDF of JCT and of latency ratio,
cluster throughput over time).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from experiments.common.pool import HERE, Pool, run_all
from experiments.common.simrun import RunSpec, simulate, write_outputs
from shared.cluster import Cluster
from simulator.engine import Progress
from simulator.metrics import SimResult

# The paper's numbers for a run label: makespan h, avg JCT h, avg wait h,
# max LR, avg fragments per round (the first five COLUMNS).
PaperRow = tuple[float, float, float, float, float]


class Experiment(msgspec.Struct, frozen=True):
    name: str
    title: str
    runs: tuple[tuple[str, RunSpec], ...]  # (label, spec)
    paper: tuple[tuple[str, PaperRow], ...] = ()  # (policy, the paper's numbers)


ProgressFactory = Callable[[str], tuple[Progress | None, Callable[[], None]]]


def run_experiment(exp: Experiment, out: Path, progress: ProgressFactory | None = None,
                   pool: Pool = HERE) -> dict[str, dict[str, object]]:
    """Every run of ``exp``, where ``pool`` says (progress bars only one
    after another, here); the summaries by label, also written under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    specs = dict(exp.runs)

    def here(label: str, spec: RunSpec) -> tuple[Cluster, SimResult]:
        update, close = progress(label) if progress else (None, lambda: None)
        try:
            return simulate(spec, update)
        finally:
            close()

    runs = run_all(pool, _simulate, {label: (label, spec) for label, spec in exp.runs},
                   here=here)
    summaries: dict[str, dict[str, object]] = {}
    results: dict[str, SimResult] = {}
    for label, (cluster, result) in runs.items():
        summaries[label] = write_outputs(out / _slug(label), specs[label], cluster, result)
        results[label] = result
    (out / "results.json").write_text(json.dumps(summaries, indent=2) + "\n")
    (out / "results.md").write_text(render_markdown(exp, summaries))
    from experiments.common.plots import plot_results

    plot_results(exp.name, results, out)
    return summaries


def _simulate(label: str, spec: RunSpec) -> tuple[Cluster, SimResult]:
    """One run, without progress (a worker's whole task; ``label``: the key)."""
    return simulate(spec)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


COLUMNS = (
    ("makespan_h", "Makespan (h)", "{:.2f}"),
    ("avg_jct_h", "Avg JCT (h)", "{:.2f}"),
    ("avg_wait_h", "Avg wait (h)", "{:.2f}"),
    ("max_lr", "Max LR", "{:.2f}"),
    ("avg_frag", "Avg frag", "{:.2f}"),
    ("floor_avg_jct_h", "Floor JCT (h)", "{:.2f}"),
    ("excess_avg_jct_h", "Excess JCT (h)", "{:.2f}"),
    ("p99_jct_h", "p99 JCT (h)", "{:.2f}"),
    ("max_ftf", "Max FTF", "{:.2f}"),
    ("unfair_fraction", "FTF>1", "{:.0%}"),
    ("jobs_finished", "Done", "{}"),
    ("planner_p95_s", "Plan p95 (s)", "{:.3f}"),
)


Column = tuple[str, str, str]  # (key, title, format)


def markdown_table(first: str, columns: Sequence[Column],
                   rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A markdown table: one row per ``rows`` entry, labelled in the
    ``first`` column, its ``columns`` values formatted."""
    lines = ["| " + " | ".join([first, *(title for _, title, _ in columns)]) + " |",
             "|" + "---|" * (len(columns) + 1)]
    for label, row in rows.items():
        cells = [fmt.format(row[key]) for key, _, fmt in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(exp: Experiment, summaries: dict[str, dict[str, object]]) -> str:
    lines = [f"# {exp.title}", "", *markdown_table("run", COLUMNS, summaries)]
    floors = {label: f"{s['floor_makespan_h']:.2f} h" for label, s in summaries.items()}
    shown = (next(iter(floors.values())) if len(set(floors.values())) == 1
             else ", ".join(f"{label} {v}" for label, v in floors.items()))
    if floors:
        lines += ["", f"Floor makespan (every job alone on its best resources from its "
                  f"submission): {shown}. Floor JCT: the mean of the finished jobs' floors; "
                  "excess JCT: avg JCT minus it."]
    if exp.paper:
        lines += ["", "The paper's numbers (same columns, first five):", "",
                  "| run | " + " | ".join(t for _, t, _ in COLUMNS[:5]) + " |",
                  "|" + "---|" * 6]
        for policy, vals in exp.paper:
            lines.append(f"| paper {policy} | " + " | ".join(f"{v:g}" for v in vals) + " |")
    return "\n".join(lines) + "\n"
