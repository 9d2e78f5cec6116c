"""The paper's comparisons as named experiments (Hops §4.2-4.6).

Each experiment is a list of simulation runs; ``run_experiment`` executes
them, then writes ``results.json`` (one summary per run), ``results.md`` (a
table beside the paper's numbers) and PNG plots (CDF of JCT and of latency
ratio, cluster throughput over time).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from hops.simrun import RunSpec, prepare, simulate, write_outputs
from scheduling.registry import POLICIES as REGISTERED
from scheduling.registry import parse_policy
from simulator.load import TARGET, compression
from simulator.metrics import SimResult
from simulator.workloads import trace_reference

# Table 3 (physical, 64 GPUs) and Table 4 (simulated, 512 GPUs) of the paper:
# makespan h, avg JCT h, avg wait h, max LR, avg fragments per round.
PAPER: dict[str, dict[str, tuple[float, float, float, float, float]]] = {
    "table3": {
        "hops": (9.51, 3.2, 0.95, 0.37, 0.15),
        "sia": (11.68, 4.41, 1.47, 1.03, 5.89),
        "gavel": (14.46, 5.92, 2.11, 1.31, 3.36),
    },
    "table4": {
        "hops": (10.48, 2.24, 0.87, 3.22, 0.45),
        "sia": (12.36, 3.79, 1.68, 78.5, 56.0),
        "gavel": (15.42, 4.04, 2.24, 70.43, 18.0),
    },
}
POLICIES = ("hops", "sia", "gavel")
PRIORITIES = ("lr", "las", "sjf", "srtf", "ftf", "fifo")
RATES = (30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
# Requirement-set generators: the project's rule (an assumption) or §4.2 read
# literally (simulator/generators.py); the suffix of the generator's name.
GENERATOR_CHOICES = ("project", "literal")
TRACES = tuple(f"elasticflow-cluster0{i}" for i in range(1, 5))
TRACE_JOBS = 1000  # the first N jobs of each trace (the rule of simulator/load.py)


def with_variants(policies: tuple[str, ...], variants: tuple[str, ...]) -> tuple[str, ...]:
    """``policies`` with each named variant of the registry (``hops-paper``,
    ``sia-estimator``, ...) right after the policy it varies, or at the end."""
    out = list(policies)
    for v in variants:
        if v not in REGISTERED or v in POLICIES:
            known = ", ".join(p for p in REGISTERED if p not in POLICIES)
            raise ValueError(f"unknown variant {v!r}; known: {known}")
        base = v.split("-", 1)[0]
        at = out.index(base) + 1 if base in out else len(out)
        while at < len(out) and out[at].startswith(base + "-"):
            at += 1
        if v not in out:
            out.insert(at, v)
    return tuple(out)
WORKLOAD_SUFFIX = {"project": "", "literal": "-literal"}


class Experiment(msgspec.Struct, frozen=True):
    name: str
    title: str
    runs: tuple[tuple[str, RunSpec], ...]  # (label, spec)


def define(name: str, seed: int = 0, trace: str | None = None, first_n: int | None = None,
           compress: float = 1.0, rates: tuple[float, ...] = RATES,
           policies: tuple[str, ...] = POLICIES, generator: str = "project") -> Experiment:
    """The runs of experiment ``name``; ``first_n`` and ``compress`` apply to
    every run's workload. ``policies`` are the specs compared (each run's
    label is its spec); ``priorities`` varies the queue priority of the first.
    ``generator`` picks the requirement sets of the paper's workloads:
    ``project`` (paper-physical, paper-sim) or ``literal`` (their
    ``-literal`` twins); it does not apply to a trace (``elasticflow``)."""
    if generator not in GENERATOR_CHOICES:
        raise ValueError(f"unknown generator {generator!r}; known: "
                         f"{', '.join(GENERATOR_CHOICES)}")
    if name == "elasticflow" and generator != "project":
        raise ValueError(f"generator {generator!r} does not apply to 'elasticflow': "
                         "its requirement sets come from the trace")
    if name == "traces" and generator != "project":
        raise ValueError(f"generator {generator!r} does not apply to 'traces': "
                         "their requirement sets come from the traces")
    for p in policies:
        parse_policy(p)  # a bad spec fails before the first run
    if name == "traces":
        return _traces(seed, trace, first_n or TRACE_JOBS, policies)
    exp = _define(name, seed, trace, rates, policies, WORKLOAD_SUFFIX[generator])
    if generator == "literal":
        exp = msgspec.structs.replace(exp, title=f"{exp.title}, §4.2's literal requirement sets")
    runs = tuple(
        (label, msgspec.structs.replace(spec, first_n=first_n or spec.first_n,
                                        compress=compress if compress != 1.0 else spec.compress))
        for label, spec in exp.runs
    )
    return msgspec.structs.replace(exp, runs=runs)


def _define(name: str, seed: int, trace: str | None, rates: tuple[float, ...],
            policies: tuple[str, ...], suffix: str = "") -> Experiment:
    if name == "table3":
        base = RunSpec(cluster="paper-physical", workload=f"paper-physical{suffix}", seed=seed)
        runs = tuple((p, msgspec.structs.replace(base, policy=p)) for p in policies)
        return Experiment(name, "Physical 64-GPU cluster (Table 3)", runs)
    if name == "table4":
        base = RunSpec(cluster="paper-sim-512", workload=f"paper-sim{suffix}", seed=seed)
        runs = tuple((p, msgspec.structs.replace(base, policy=p)) for p in policies)
        return Experiment(name, "Simulated 512-GPU cluster (Table 4)", runs)
    if name == "priorities":
        base = RunSpec(cluster="paper-sim-512", workload=f"paper-sim{suffix}", seed=seed)
        runs = tuple(
            (f"{policies[0]}-{q}", msgspec.structs.replace(base, policy=policies[0], priority=q))
            for q in PRIORITIES
        )
        return Experiment(name, "Hops under different queue priorities (Figure 13)", runs)
    if name == "arrival-rates":
        base = RunSpec(cluster="paper-sim-512", workload=f"paper-sim{suffix}", seed=seed)
        runs = tuple(
            (f"{p}@{rate:g}/h", msgspec.structs.replace(base, policy=p, rate_per_h=rate))
            for rate in rates
            for p in policies
        )
        return Experiment(name, "Average JCT against the arrival rate (§4.6)", runs)
    if name == "elasticflow":
        base = RunSpec(cluster="paper-sim-512", workload=trace or "elasticflow-cluster04",
                       seed=seed)
        runs = tuple((p, msgspec.structs.replace(base, policy=p)) for p in policies)
        return Experiment(name, f"ElasticFlow trace {base.workload}", runs)
    known = "table3, table4, priorities, arrival-rates, elasticflow, traces, sharing"
    raise ValueError(f"unknown experiment {name!r}; known: {known}")


def _traces(seed: int, traces: str | None, first_n: int,
            policies: tuple[str, ...]) -> Experiment:
    """Every policy on the first ``first_n`` jobs of each trace, arrivals
    compressed to the offered load of :mod:`simulator.load` (its rule)."""
    names = tuple(t for t in (traces or ",".join(TRACES)).split(",") if t)
    runs: list[tuple[str, RunSpec]] = []
    for trace in names:
        base = RunSpec(cluster="paper-sim-512", workload=trace, seed=seed, first_n=first_n)
        cluster, truth, jobs = prepare(base)
        factor = compression(jobs, truth, cluster, trace_reference(cluster, truth))
        short = trace.removeprefix("elasticflow-")
        runs += [(f"{short}/{p}", msgspec.structs.replace(base, policy=p, compress=factor))
                 for p in policies]
    title = (f"ElasticFlow traces, first {first_n} jobs each, arrivals compressed to "
             f"{TARGET:g}x the cluster's GPUs")
    return Experiment("traces", title, tuple(runs))


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
    from hops.plots import plot_results

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
    paper = PAPER.get(exp.name)
    if paper:
        lines += ["", "The paper's numbers (same columns, first five):", "",
                  "| run | " + " | ".join(t for _, t, _ in COLUMNS[:5]) + " |",
                  "|" + "---|" * 6]
        for policy, vals in paper.items():
            lines.append(f"| paper {policy} | " + " | ".join(f"{v:g}" for v in vals) + " |")
    return "\n".join(lines) + "\n"
