"""The accuracy study's tables, as Markdown, from its JSON results, and
their update in ``docs/accuracy.md`` (between ``<!-- BEGIN accuracy:NAME -->``
and ``<!-- END accuracy:NAME -->`` markers; the prose around them is kept).

``python -m bench.accuracy_docs out/accuracy/accuracy.json`` updates the
document from saved results without running the study again.
"""

from __future__ import annotations

import json
import re
import sys
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
            f"{s['profile_iters']} iterations, {s['repeats']} passes; a run repeated "
            f"(at most {s['tries']} runs) while other work took more than "
            f"{100 * s['quiet']:.0f}% of the CPUs.\n\n"
            f"gloo all-reduce of two pinned processes (mean of 100): {sizes}; "
            f"{_fit_text(b)}.")


def _fit_text(b: Mapping[str, Any]) -> str:
    """The Eq. (2) fit; results saved before the latency term was fitted
    have no ``latency_s`` (their fit went through the origin)."""
    bandwidths = f"B_link = {b['link']:.3g} and B_net = {b['net']:.3g} parameters/s"
    if "latency_s" not in b:
        return f"fitted through the origin, {bandwidths}"
    return (f"fitted T = α + k·params (least squares, α >= 0): α = "
            f"{1000 * b['latency_s']:.2f} ms, {bandwidths}, for N = 2 "
            f"(T_c = k·α + params·(N-1)/N / B_link on one node, k·α + params/B_net "
            f"across nodes, for k gradient buckets; α more for each other collective "
            f"of an iteration); the cluster's overlap_residual (T̃c/T_c of Eq. 1) is "
            f"{b['overlap_residual']:.1f}")


def _grouped(data: Data) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Each (model, configuration)'s rows over the passes, in order."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for models in data["repeats"]:
        for m in models:
            for r in m["rows"]:
                out.setdefault((m["model"], r["config"]), []).append(r)
    return out


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items)


def _main_table(data: Data) -> str:
    rows = []
    for (model, config), rs in _grouped(data).items():
        acc = [100 * r["accuracy"] for r in rs]
        rows.append((model, f"`{config}`", f"{_mean(r['predicted'] for r in rs):.1f}",
                     f"{_mean(r['measured']['throughput'] for r in rs):.1f}",
                     f"**{_mean(acc):.1f}%**", " / ".join(f"{a:.1f}" for a in acc),
                     f"{100 * _mean(r['measured']['cv'] for r in rs):.1f}%",
                     f"{100 * max(r['foreign'] for r in rs):.1f}%"))
    return _table(("model", "configuration", "predicted (samples/s)", "measured (samples/s)",
                   "accuracy", "per pass (%)", "CV", "other work"), "llrrrlrr", rows)


def _terms_table(data: Data) -> str:
    rows = []
    for (model, config), rs in _grouped(data).items():
        def pair(key: str, rs: list[Mapping[str, Any]] = rs) -> str:
            exp = _mean(r["expected"][key] for r in rs)
            got = [r["measured"][key] for r in rs if r["measured"][key] is not None]
            return f"{exp:.2f} / " + (f"{_mean(got):.2f}" if got else "–")
        # Results saved before collectives were counted have no t_s.
        other = _mean(r["expected"].get("t_s", 0.0) for r in rs)
        rows.append((model, f"`{config}`", *(pair(k) for k in ("iteration", "t_d", "t_w",
                                                                "t_c")), f"{other:.2f}"))
    return _table(("model", "configuration", "iteration (ms)", "T_d (ms)", "T_w (ms)",
                   "T_c (ms)", "other collectives (ms)"), "llrrrrr", rows)


def _profile_table(data: Data) -> str:
    keys = ("t_f_ms", "t_b_ms", "t_u_ms", "t_d_mean_ms")
    rows = []
    for i, m in enumerate(data["repeats"][0]):
        ps = [models[i]["profile"] for models in data["repeats"]]
        sums = [sum(p[k] for k in keys) for p in ps]
        rows.append((m["model"], f"{m['params']:,}", str(m["batch_size"]),
                     *(f"{_mean(p[k] for p in ps):.2f}" for k in keys),
                     " / ".join(f"{v:.1f}" for v in sums), str(ps[0]["pattern"]),
                     f"{100 * max(p['foreign'] for p in ps):.1f}%"))
    return _table(("model", "parameters", "batch", "T_f (ms)", "T_b (ms)", "T_u (ms)",
                   "mean T_d (ms)", "T_f+T_b+T_u+T_d per pass (ms)", "pattern", "other work"),
                  "lrrrrrrlrr", rows)


def table_text(data: Data) -> str:
    """Predicted against measured (means over the passes), the profiles, and
    Eq. (1)'s terms against what the runs saw."""
    return (f"{_main_table(data)}\n\nProfiles (one process, node-a's device 0; means over "
            f"the passes):\n\n{_profile_table(data)}\n\nPredicted / measured, per "
            f"iteration, means over the passes (T_c: Eq. 2 with the fitted latency per "
            f"gradient bucket / the all-reduce span the plugin timed in backward; other "
            f"collectives: buffer broadcasts and the ranks' agreement, predicted only, "
            f"measured within T_f and T_w):\n\n{_terms_table(data)}")


def _points(n: int) -> list[int]:
    return sorted({k for k in FIG7B_POINTS if k <= n} | {n})


def _acc(value: float, truth: float) -> float:
    return 100 * (1 - abs(value - truth) / truth)


def fig7b_table(data: Data) -> str:
    """Figure 7b: the first pass's estimates (and accuracy) after k
    running-mode samples, and the accuracy at k averaged over the passes."""
    out = []
    passes = data["repeats"]
    for i, m in enumerate(passes[0]):
        for config in m["fig7b"]:
            runs = [(models[i]["fig7b"][config],
                     next(r for r in models[i]["rows"] if r["config"] == config))
                    for models in passes]
            steps, row = runs[0]
            truth = row["measured"]["throughput"]
            ks = _points(min(len(st) for st, _ in runs) - 1)

            def cell(key: str, k: int, steps: Any = steps, truth: float = truth) -> str:
                return f"{steps[k][key]:.1f} ({_acc(steps[k][key], truth):.0f}%)"

            def mean_acc(key: str, k: int, runs: Any = runs) -> str:
                got = [_acc(st[k][key], r["measured"]["throughput"]) for st, r in runs]
                return f"{_mean(got):.1f}%"

            rows = [("estimate, pass 1", *(cell("estimate", k) for k in ks)),
                    ("theoretical layer, pass 1", *(cell("formula", k) for k in ks))]
            if len(runs) > 1:
                rows += [(f"estimate accuracy, mean of {len(runs)} passes",
                          *(mean_acc("estimate", k) for k in ks)),
                         (f"theoretical layer accuracy, mean of {len(runs)} passes",
                          *(mean_acc("formula", k) for k in ks))]
            title = f"**{m['model']} `{config}`**, measured {truth:.1f} samples/s in pass 1"
            out.append(title + "\n\n" + _table(("after k samples", *map(str, ks)),
                                               "l" + "r" * len(ks), rows))
    return "\n\n".join(out)


def _replace(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN accuracy:{name} -->\n).*?(<!-- END accuracy:{name} -->)",
                         re.S)
    if not pattern.search(text):
        raise ValueError(f"docs/accuracy.md has no accuracy:{name} markers")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def update_docs(path: Path, data: Data) -> None:
    """Replace the marked blocks of ``path`` with this run's tables."""
    text = path.read_text()
    for name, body in (("setup", setup_text(data)), ("table", table_text(data)),
                       ("fig7b", fig7b_table(data))):
        text = _replace(text, name, body)
    path.write_text(text)


if __name__ == "__main__":
    update_docs(Path(__file__).resolve().parents[1] / "docs" / "accuracy.md",
                json.loads(Path(sys.argv[1]).read_text()))
