"""Convert Synergy's measured CPU-scaling tables into the world model's JSON.

Synergy (Mohan et al., "Looking Beyond GPUs for DNN Scheduling on
Multi-Tenant Clusters", OSDI'22, MIT licence) ships one Python file per model
and GPU count, ``simulator/models/<model>_<gpus>.py``, whose ``self.tput`` is
a numpy array: rows are CPU cores per GPU on the axis ``cpu_val`` of
``simulator/jobs/job.py``, columns are memory per GPU on ``mem_val``, values
are throughput normalised to the GPU-proportional share (3 cores and 62.5 GB
per GPU on its 8-GPU, 24-core, 500 GB servers). This script reads those files
with :mod:`ast` only (it never imports or executes them), keeps the column of
the most memory and the measured (non-zero) rows, and writes
``world/data/synergy/cpu_scaling.json``; it also copies Synergy's LICENSE
beside it. docs/simulator-data.md, "CPU scaling (Synergy)", explains each
choice.

    python -m bench.synergy_convert [--source ../shared/data/synergy] [--out world/data/synergy]
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
from pathlib import Path
from typing import Any

# shufflenet_12's table is a copy of shufflenet_4's (rows up to 6 cores per
# GPU, i.e. 72 cores for 12 GPUs, more than one of Synergy's servers holds)
# and its ``cpus`` (3) contradicts its own table: a placeholder, not a
# measurement, and no simulator path of Synergy reads it.
SKIPPED = {"shufflenet_12"}


def _self_assignments(tree: ast.Module) -> dict[str, ast.expr]:
    """``self.<name> = <value>`` assignments anywhere in the module."""
    out: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id == "self"):
            out[target.attr] = node.value
    return out


def axes(job_py: Path) -> tuple[list[int], list[float]]:
    """``cpu_val`` and ``mem_val`` of Synergy's Job, in index order."""
    values = _self_assignments(ast.parse(job_py.read_text()))
    cpu = ast.literal_eval(values["cpu_val"])
    mem = ast.literal_eval(values["mem_val"])
    return ([int(cpu[i]) for i in sorted(cpu)], [float(mem[i]) for i in sorted(mem)])


def _gpus(tree: ast.Module) -> int:
    """The GPU count passed to ``ModelStats.__init__`` by ``super().__init__(name, N)``."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and ast.unparse(node.func) == "super().__init__"
                and len(node.args) == 2):
            return int(ast.literal_eval(node.args[1]))
    raise ValueError("no super().__init__(name, gpus) call")


def parse_model(path: Path) -> tuple[int, int, list[list[float]]]:
    """(gpus, Synergy's own best cores per GPU ``self.cpus``, the tput rows)."""
    tree = ast.parse(path.read_text())
    values = _self_assignments(tree)
    array = values["tput"]
    if not (isinstance(array, ast.Call) and ast.unparse(array.func) == "np.array"):
        raise ValueError(f"{path.name}: self.tput is not np.array([...])")
    rows = ast.literal_eval(array.args[0])
    return _gpus(tree), int(ast.literal_eval(values["cpus"])), [
        [float(v) for v in row] for row in rows]


def convert_table(rows: list[list[float]], cores_axis: list[int],
                  mem_axis: list[float]) -> dict[str, Any]:
    """Keep the last (most memory) column and drop all-zero rows (not measured).

    One-GPU tables have a column per ``mem_val`` entry; multi-GPU tables have
    one fewer, lacking the 20.83 GB column (their first column equals the
    62.5 GB column of the one-GPU table, e.g. m5), so the last column is the
    most memory in both."""
    if len(rows) != len(cores_axis):
        raise ValueError(f"{len(rows)} rows for {len(cores_axis)} core counts")
    width = len(rows[0])
    if width not in (len(mem_axis), len(mem_axis) - 1) or any(len(r) != width for r in rows):
        raise ValueError(f"unexpected table width {width}")
    cores = [c for c, row in zip(cores_axis, rows, strict=True) if any(row)]
    tput = [row[-1] for row in rows if any(row)]
    if any(v <= 0 for v in tput):
        raise ValueError("a measured row has no throughput at full memory")
    return {"cores": cores, "throughput": tput, "memory_gb_per_gpu": mem_axis[-1]}


def convert(source: Path) -> dict[str, Any]:
    cores_axis, mem_axis = axes(source / "job.py")
    models: dict[str, dict[str, Any]] = {}
    for path in sorted((source / "models").glob("*_*.py")):
        if path.stem in SKIPPED or path.stem.startswith("_") or path.stem == "model_stats":
            continue
        name = path.stem.rsplit("_", 1)[0]
        gpus, best, rows = parse_model(path)
        table = convert_table(rows, cores_axis, mem_axis)
        table["synergy_cpus"] = best
        models.setdefault(name, {})[str(gpus)] = table
    return {
        "source": "msr-fiddle/synergy, simulator/models/*.py (tput) and simulator/jobs/job.py",
        "commit": (source / "COMMIT").read_text().strip(),
        "licence": "MIT, see LICENSE",
        "cores": "CPU cores per GPU",
        "throughput": ("normalised: 1.0 at 3 cores and 62.5 GB per GPU "
                       "(Synergy's proportional share)"),
        "models": models,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("../shared/data/synergy"))
    parser.add_argument("--out", type=Path, default=Path("world/data/synergy"))
    args = parser.parse_args(argv)
    data = convert(args.source)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_scaling.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    shutil.copyfile(args.source / "LICENSE", args.out / "LICENSE")


if __name__ == "__main__":
    main()
