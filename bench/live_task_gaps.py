"""The live job-to-job gaps on a GPU of a real executor (docs/hare.md §7,
step 4b), from its log's ``task done`` lines: for each pair of consecutive
entries on a GPU, the second's compute start less the first's compute end
(``started_at``, ``ended_at``: the trainers' clocks on the wall clock),
split by whether the two are of different jobs (a switch, counted while
both jobs run) or of the same job, each also for the pairs whose second
entry was staged (``staged`` in its line); the share is of the task the gap
starts. Task: an entry's compute span.

The gap holds whatever the GPU waited for: the round's parameters, its
barrier, the planned start, the pool and the trainer's hand-off.

    PYTHONPATH=. .venv/bin/python bench/live_task_gaps.py <data>/logs/cluster.log [...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple


class Done(NamedTuple):
    job: str
    gpu: tuple[str, int]  # (server, GPU index)
    started: float
    ended: float
    staged: bool  # sent to its trainer while the entry before it computed


class Gap(NamedTuple):
    switch: bool  # the two entries are of different jobs
    seconds: float
    task_s: float  # the compute span of the entry it starts
    staged: bool  # that entry was staged


def dones(lines: Iterable[str]) -> list[Done]:
    """The ``task done`` records among an executor log's JSON lines."""
    out = []
    for line in lines:
        try:
            x = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(x, dict) and x.get("event") == "task done" and "started_at" in x:
            out.append(Done(x["job_id"], (x["server_id"], x["gpu_index"]),
                            x["started_at"], x["ended_at"], bool(x.get("staged"))))
    return out


def gaps(records: list[Done]) -> list[Gap]:
    """Each GPU's consecutive pairs, in compute order; a pair of two jobs
    only while both run (the second began before and the first ends after:
    a job's arrival or its end is no switch)."""
    first = {r.job: min(x.started for x in records if x.job == r.job) for r in records}
    last = {r.job: max(x.ended for x in records if x.job == r.job) for r in records}
    out = []
    for gpu in sorted({r.gpu for r in records}):
        runs = sorted((r for r in records if r.gpu == gpu), key=lambda r: r.started)
        out += [Gap(a.job != b.job, b.started - a.ended, b.ended - b.started, b.staged)
                for a, b in itertools.pairwise(runs)
                if a.job == b.job or (first[b.job] < a.ended and last[a.job] > b.started)]
    return out


def pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    args = ap.parse_args()
    runs = [dones(path.read_text(errors="replace").splitlines()) for path in args.logs]
    records = [d for run in runs for d in run]
    found = [g for run in runs for g in gaps(run)]  # a run's job ids may recur in another
    task_ms = 1e3 * statistics.median(r.ended - r.started for r in records)
    print(f"{len(records)} entries, median task {task_ms:.1f} ms")
    print(f"{'pairs':9} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'p50 %':>8} {'p95 %':>8}")
    rows = (("switch", lambda g: g.switch), ("staged", lambda g: g.switch and g.staged),
            ("same job", lambda g: not g.switch), ("staged", lambda g: not g.switch and g.staged))
    for name, kept in rows:
        some = [g for g in found if kept(g) and g.task_s > 0]
        ms = [1e3 * g.seconds for g in some]
        share = [100 * g.seconds / g.task_s for g in some]
        if ms:
            print(f"{name:9} {len(ms):>4} {pct(ms, 0.5):8.1f} {pct(ms, 0.95):8.1f} "
                  f"{pct(share, 0.5):7.1f}% {pct(share, 0.95):7.1f}%")


if __name__ == "__main__":
    main()
