"""``results.md`` of the sharing experiment, and issue 20's targets (a)-(d)
read off ``results.json`` as they come out (docs/tenancy.md, rule 9)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments.sharing.setup import Setup

COLUMNS = (("jobs", "{}"), ("avg_wait_h", "{:.3f}"), ("avg_jct_h", "{:.3f}"),
           ("anomalous_jobs", "{}"), ("max_excess_wait_h", "{:.3f}"))


def targets(results: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each of targets (a)-(d): met, missed or pending, with its numbers."""
    out: dict[str, str] = {}
    hived = results.get("hived")
    if hived is None:
        out["a"] = "pending: no `hived` run"
    else:
        bad = {t: m["anomalous_jobs"] for t, m in hived["tenants"].items() if m["anomalous_jobs"]}
        out["a"] = "met: no anomalous job" if not bad else f"missed: anomalous jobs {bad}"
    quota = results.get("quota")
    if quota is None:
        out["b"] = "pending: no `quota` run"
    else:
        shares = {t: m["anomalous_jobs"] / m["jobs"] for t, m in quota["tenants"].items()
                  if m["jobs"]}
        best = max(shares.items(), key=lambda kv: kv[1], default=("-", 0.0))
        verdict = "met" if best[1] >= 0.10 else "missed"
        out["b"] = f"{verdict}: the largest share of anomalous jobs is {best[0]}'s, {best[1]:.1%}"
    opp, private = results.get("hived-opportunistic"), results.get("private")
    if opp is None or private is None:
        out["c"] = "pending: no `hived-opportunistic` run"
    else:
        worse = {t: (m["avg_wait_h"], private["tenants"][t]["avg_wait_h"])
                 for t, m in opp["tenants"].items()
                 if m["avg_wait_h"] > private["tenants"][t]["avg_wait_h"]}
        out["c"] = ("met: every tenant waits at most as long as in private" if not worse
                    else f"missed: (shared, private) average waits {worse}")
    if hived is None or quota is None:
        out["d"] = "pending: needs `hived` and `quota`"
    else:
        h, q = hived["utilisation"], quota["utilisation"]
        out["d"] = f"{'met' if h >= q else 'missed'}: hived {h:.1%}, quota {q:.1%}"
    return out


def render_sharing(setup: Setup, results: Mapping[str, Mapping[str, Any]],
                   pending: Mapping[str, str], jobs: int, first_n: int | None,
                   inner: str) -> str:
    w = setup.workload
    lines = [
        "# Sharing experiment (issue 20; HiveD §5.2)", "",
        f"Shared period: [{w.start}, {w.end}] s on the traces' clock ({w.period_s / 86400:.2f}"
        f" days); {jobs} jobs run{'' if first_n is None else f' (first {first_n})'}; "
        f"GPU type {setup.gpu}; inner policy `{inner}`; cluster "
        f"{setup.cluster.total_gpus // 8} servers, {setup.cluster.total_gpus} GPUs.", "",
        "| tenant | jobs in period | demand (GPUs) | cells (8 GPUs) |", "|---|---|---|---|",
    ]
    for d in w.demands:
        lines.append(f"| {d.tenant} | {d.jobs} | {d.gpu_seconds / w.period_s:.2f} | "
                     f"{setup.quota[d.tenant]} |")
    lines += ["", "| policy | tenant | jobs | avg wait (h) | avg JCT (h) | anomalous | "
              "max excess wait (h) |", "|---|---|---|---|---|---|---|"]
    for label, entry in results.items():
        for tenant, m in entry["tenants"].items():
            cells = " | ".join(fmt.format(m[key]) for key, fmt in COLUMNS)
            lines.append(f"| {label} | {tenant} | {cells} |")
    lines += ["", "| policy | utilisation | avg fragmentation | jobs done | wall (s) |",
              "|---|---|---|---|---|"]
    for label, entry in results.items():
        frag = entry["avg_fragmentation"]
        lines.append(f"| {label} | {entry['utilisation']:.1%} | "
                     f"{'-' if frag is None else f'{frag:.1%}'} | {entry['jobs_finished']} | "
                     f"{entry['wall_s']:.0f} |")
    if pending:
        lines += ["", "Pending (not in this registry):", ""]
        lines += [f"- `{label}`: {why}" for label, why in pending.items()]
    lines += ["", "Targets of issue 20:", ""]
    lines += [f"- ({k}) {v}" for k, v in targets(results).items()]
    return "\n".join(lines) + "\n"
