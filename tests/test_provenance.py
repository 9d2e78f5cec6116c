"""What produced a result (experiments/common/provenance.py) is written beside it: the
commit, Python, HiGHS, numpy and msgspec (docs/results.md, "Reproducible
results")."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from experiments.common.provenance import ROOT, commit, provenance
from experiments.common.simrun import RunSpec, simulate, write_outputs

COMMIT = re.compile(r"[0-9a-f]{40}(\+dirty)?|unknown")
KEYS = {"commit", "python", "highspy", "numpy", "msgspec", "platform"}


def test_provenance_names_the_commit_and_the_versions() -> None:
    info = provenance()
    assert set(info) == KEYS
    assert COMMIT.fullmatch(info["commit"]), info["commit"]
    assert info["highspy"] == version("highspy") and info["numpy"] == version("numpy")
    assert info["python"].startswith("3.")
    assert all(isinstance(v, str) and v for v in info.values())


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="not a git checkout")
def test_in_a_checkout_the_commit_is_head() -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert commit().split("+")[0] == head


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_tracked_changes_mark_the_commit_dirty(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    (tmp_path / "untracked.txt").write_text("not counted\n")
    assert commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("2\n")
    assert commit(tmp_path) == f"{head}+dirty"


def test_outside_a_checkout_or_without_git_the_commit_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert commit(tmp_path) == "unknown"
    # A folder inside a checkout but not its top (a venv's site-packages) is no checkout.
    if (ROOT / ".git").exists():
        assert commit(ROOT / "hops") == "unknown"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert commit() == "unknown"


def test_summary_json_carries_the_provenance(tmp_path: Path) -> None:
    spec = RunSpec(cluster="paper-physical", workload="paper-physical", first_n=3)
    cluster, result = simulate(spec)
    summary = write_outputs(tmp_path, spec, cluster, result)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["provenance"] == summary["provenance"]
    assert set(written["provenance"]) == KEYS
    assert COMMIT.fullmatch(written["provenance"]["commit"])


def test_each_entry_of_an_experiments_results_json_carries_it(tmp_path: Path) -> None:
    from experiments.common.suite import Experiment, run_experiment

    spec = RunSpec(cluster="paper-physical", workload="paper-physical", first_n=3)
    run_experiment(Experiment("tiny", "Tiny", (("hops", spec),)), tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["hops"]["provenance"]) == KEYS
