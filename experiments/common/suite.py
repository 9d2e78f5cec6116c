"""A named list of simulation runs and its outputs (Hops §4.2-4.6).

``run_experiment`` executes the runs, then writes ``results.json`` (one
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

from experiments.common.simrun import RunSpec, simulate, write_outputs
from simulator.metrics import SimResult

# The paper's numbers for a run label: makespan h, avg JCT h, avg wait h,
# max LR, avg fragments per round (the first five COLUMNS).
PaperRow = tuple[float, float, float, float, float]


class Experiment(msgspec.Struct, frozen=True):
    name: str
    title: str
    runs: tuple[tuple[str, RunSpec], ...]  # (label, spec)
    paper: tuple[tuple[str, PaperRow], ...] = ()  # (policy, the paper's numbers)


def run_experiment(
    exp: Experiment,
    out: Path,
    progress: Callable[[str], tuple[Callable[[float, int, int], None] | None, Callable[[], None]]]
    | None = None,
) -> dict[str, dict[str, object]]:
    out.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict[str, object]] = {}
    results: dict[str, SimResult] = {}
    for label, spec in exp.runs:
        update, close = progress(label) if progress else (None, lambda: None)
        try:
            cluster, result = simulate(spec, update)
        finally:
            close()
        summaries[label] = write_outputs(out / _slug(label), spec, cluster, result)
        results[label] = result
    (out / "results.json").write_text(json.dumps(summaries, indent=2) + "\n")
    (out / "results.md").write_text(render_markdown(exp, summaries))
    from experiments.common.plots import plot_results

    plot_results(exp.name, results, out)
    return summaries


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
