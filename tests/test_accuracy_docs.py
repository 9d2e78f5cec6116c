"""The accuracy study's Markdown: its tables from saved results, and the
update of docs/accuracy.md between markers with the prose kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.accuracy_docs import table_text, update_docs


def row(config: str, predicted: float, measured: float, t_s: float | None) -> dict[str, Any]:
    expected = {"t_d": 8.0, "t_f": 14.0, "t_b": 12.0, "t_u": 1.0, "t_w": 0.0, "t_c": 2.0,
                "pattern": 2, "iteration": 40.0}
    if t_s is not None:  # results saved before collectives were counted have none
        expected["t_s"] = t_s
    return {"model": "cnn", "config": config, "predicted": predicted,
            "measured": {"throughput": measured, "samples": 8, "per_server": {}, "cv": 0.05,
                         "t_d": 9.0, "t_w": 1.5, "t_c": 4.0, "iteration": 45.0},
            "accuracy": 1 - abs(predicted - measured) / measured, "expected": expected,
            "foreign": 0.001, "steal": 0.0, "attempts": 1}


def results(t_s: float | None) -> dict[str, Any]:
    model = {"model": "cnn", "params": 113_738, "batch_size": 32,
             "profile": {"t_f_ms": 14.0, "t_b_ms": 12.0, "t_u_ms": 1.0, "t_d_mean_ms": 8.0,
                         "pattern": 2, "foreign": 0.002},
             "rows": [row("{node-a:2}", 1600.0, 1500.0, t_s)],
             "fig7b": {"{node-a:2}": [{"estimate": 1600.0, "formula": 1600.0},
                                      {"estimate": 1510.0, "formula": 1580.0}]}}
    return {"host": {"date": "2026-11-22", "cores": 2, "torch": "2.13.0+cpu",
                     "backend": "gloo"},
            "settings": {"seconds": 20.0, "sample_s": 2.0, "warmup_samples": 2,
                         "profile_iters": 50, "quiet": 0.1, "tries": 3, "repeats": 1},
            "allreduce_s": {"65536": 0.0024}, "allreduce_spread_s": {"65536": [0.0003, 0.003,
                                                                              0.004]},
            "bandwidth": {"link": 1.7e8, "net": 3.4e8, "latency_s": 0.0018,
                          "overlap_residual": 1.0},
            "repeats": [[model]]}


@pytest.mark.parametrize(("t_s", "shown"), [(1.81, "1.81"), (None, "0.00")])
def test_terms_table_shows_the_other_collectives(t_s: float | None, shown: str) -> None:
    text = table_text(results(t_s))
    assert "| model | configuration | predicted (samples/s) | measured (samples/s) |" in text
    assert "| cnn | `{node-a:2}` | 1600.0 | 1500.0 | **93.3%** | 93.3 |" in text
    assert ("| cnn | `{node-a:2}` | 40.00 / 45.00 | 8.00 / 9.00 | 0.00 / 1.50 | 2.00 / 4.00 | "
            f"{shown} |") in text


def test_update_replaces_only_the_marked_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "accuracy.md"
    blocks = "".join(f"prose {n}\n<!-- BEGIN accuracy:{n} -->\nold\n<!-- END accuracy:{n} -->\n"
                     for n in ("setup", "table", "fig7b"))
    doc.write_text(blocks + "closing prose\n")
    update_docs(doc, results(1.81))
    text = doc.read_text()
    assert "old" not in text and text.endswith("closing prose\n")
    assert all(f"prose {n}\n<!-- BEGIN accuracy:{n} -->\n" in text
               for n in ("setup", "table", "fig7b"))
    assert "α = 1.80 ms" in text and "for k gradient buckets" in text
    assert "| estimate, pass 1 | 1600.0 (93%) | 1510.0 (99%) |" in text
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="no accuracy:setup markers"):
        update_docs(doc, results(1.81))
