"""The accuracy study's tables, as Markdown, from its JSON results, and
their update in ``docs/accuracy.md`` (between ``<!-- BEGIN accuracy:NAME -->``
and ``<!-- END accuracy:NAME -->`` markers; the prose around them is kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

Data = Mapping[str, Any]
FIG7B_POINTS = (0, 1, 2, 3, 4, 6, 8, 12, 16)


def _table(header: Iterable[str], align: str, rows: Iterable[Iterable[str]]) -> str:
    head = list(header)
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def setup_text(data: Data) -> str:
    """Host, settings and the measured all-reduce bandwidth."""
    h, s, b = data["host"], data["settings"], data["bandwidth"]
    spread = data["allreduce_spread_s"]
    sizes = ", ".join(f"{int(p) / 1000:.0f} k in {1000 * t:.2f} ms (p10 "
                      f"{1000 * spread[p][0]:.2f}, p90 {1000 * spread[p][2]:.2f})"
                      for p, t in data["allreduce_s"].items())
    return (f"Measured {h['date']} on a {h['cores']}-core CPU host (torch {h['torch']}, "
            f"{h['backend']}), one thread per process, {s['seconds']:g} s per configuration "
            f"after its first sample, samples every {s['sample_s']:g} s, the first "
            f"{s['warmup_samples']} of each server dropped, profiles of "
            f"{s['profile_iters']} iterations; a run repeated (at most {s['tries']} runs) "
            f"while other work took more than {100 * s['quiet']:.0f}% of the CPUs.\n\n"
            f"gloo all-reduce of two pinned processes (mean of 100): {sizes}; fitted "
            f"B_link = {b['link']:.3g} and B_net = {b['net']:.3g} parameters/s.")


def table_text(data: Data) -> str:
    """Predicted against measured, and Eq. (1)'s terms against what the runs saw."""
    main, terms = [], []
    for m in data["models"]:
        for r in m["rows"]:
            got, exp = r["measured"], r["expected"]
            main.append((m["model"], f"`{r['config']}`", f"{r['predicted']:.1f}",
                         f"{got['throughput']:.1f}", f"{100 * r['accuracy']:.1f}%",
                         str(got["samples"]), f"{100 * got['cv']:.1f}%",
                         f"{100 * r['foreign']:.1f}%", str(r["attempts"])))
            t_c = "–" if got["t_c"] is None else f"{got['t_c']:.2f}"
            terms.append((m["model"], f"`{r['config']}`",
                          f"{exp['iteration']:.1f} / {got['iteration']:.1f}",
                          f"{exp['t_d']:.2f} / {got['t_d']:.2f}",
                          f"{exp['t_w']:.2f} / {got['t_w']:.2f}",
                          f"{exp['t_c']:.2f} / {t_c}"))
    first = _table(("model", "configuration", "predicted (samples/s)", "measured (samples/s)",
                    "accuracy", "samples", "CV", "other work", "runs"), "llrrrrrrr", main)
    second = _table(("model", "configuration", "iteration (ms)", "T_d (ms)", "T_w (ms)",
                     "T_c (ms)"), "llrrrr", terms)
    profiles = _table(
        ("model", "parameters", "batch", "T_f (ms)", "T_b (ms)", "T_u (ms)", "mean T_d (ms)",
         "pattern", "other work", "runs"), "lrrrrrrrrr",
        ((m["model"], f"{m['params']:,}", str(m["batch_size"]),
          *(f"{m['profile'][k]:.2f}" for k in ("t_f_ms", "t_b_ms", "t_u_ms", "t_d_mean_ms")),
          str(m["profile"]["pattern"]), f"{100 * m['profile']['foreign']:.1f}%",
          str(m["profile"]["attempts"])) for m in data["models"]))
    return (f"{first}\n\nProfiles (one process, node-a's device 0):\n\n{profiles}\n\n"
            f"Predicted / measured, per iteration (T_c: Eq. 2 / the all-reduce span "
            f"the plugin timed in backward):\n\n{second}")


def _points(n: int) -> list[int]:
    return sorted({k for k in FIG7B_POINTS if k <= n} | {n})


def fig7b_table(data: Data) -> str:
    """Figure 7b: estimate (and accuracy) after k running-mode samples."""
    out = []
    for m in data["models"]:
        measured = {r["config"]: r["measured"]["throughput"] for r in m["rows"]}
        for config, steps in m["fig7b"].items():
            ks = _points(len(steps) - 1)
            truth = measured[config]

            def cell(value: float, truth: float = truth) -> str:
                return f"{value:.1f} ({100 * (1 - abs(value - truth) / truth):.0f}%)"

            rows = [("estimate (top-down)", *(cell(steps[k]["estimate"]) for k in ks)),
                    ("theoretical layer", *(cell(steps[k]["formula"]) for k in ks))]
            title = f"**{m['model']} `{config}`**, measured {truth:.1f} samples/s"
            out.append(title + "\n\n" + _table(("after k samples", *map(str, ks)),
                                               "l" + "r" * len(ks), rows))
    return "\n\n".join(out)


def _replace(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN accuracy:{name} -->\n).*?(\n<!-- END accuracy:{name} -->)",
                         re.S)
    if not pattern.search(text):
        raise ValueError(f"docs/accuracy.md has no accuracy:{name} markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def update_docs(path: Path, data: Data) -> None:
    """Replace the marked blocks of ``path`` with this run's tables."""
    text = path.read_text()
    for name, body in (("setup", setup_text(data)), ("table", table_text(data)),
                       ("fig7b", fig7b_table(data))):
        text = _replace(text, name, body)
    path.write_text(text)
