"""Could a one-process profile predict the synchronisation wait T_w? (docs/accuracy.md)

Hops §3.5 attributes T_w to inconsistent data loading: ranks run in lock
step, so each iteration every rank waits for the slowest one's data. If the
ranks' data times were independent draws from the profile's T_d, a rank of
N would wait E[max of N draws] - E[T_d] on average. This profiles each
example once (the plugin's profiling mode, one process pinned to core 0 with
one thread, as the accuracy study does) and prints that figure from the
profile's per-iteration data times, to compare with the waits measured in
the study's two-process runs.

    .venv/bin/python -m bench.accuracy_waits   # about 15 seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.accuracy_bw import ROOT
from bench.accuracy_model import SCRIPTS
from shared import jobenv
from shared.jobreport import Profiled, decode_line


def wait_from_data_spread(t_d: Sequence[float], ranks: int) -> float:
    """E[max of ``ranks`` independent draws] - E[draw] over the empirical
    distribution of ``t_d``: the k-th smallest of n values is the maximum of
    N draws with probability (k/n)^N - ((k-1)/n)^N."""
    if not t_d or ranks < 1:
        raise ValueError("need data times and at least one rank")
    xs = sorted(t_d)
    n = len(xs)
    expected_max = sum(x * (((k + 1) / n) ** ranks - (k / n) ** ranks) for k, x in enumerate(xs))
    return expected_max - statistics.fmean(xs)


def profile_data_times(script: str, iters: int) -> list[float]:
    """The per-iteration T_d of one profiling run of ``script``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {**os.environ, jobenv.JOB_ID: "waits", jobenv.MODE: "profile",
               jobenv.PROFILE_ITERS: str(iters), jobenv.REPORT_FILE: str(report),
               jobenv.THREADS: "1", "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, str(ROOT / script)], env=env, cwd=ROOT, check=True,
                       preexec_fn=lambda: os.sched_setaffinity(0, {0}), timeout=300)
        for raw in report.read_bytes().splitlines():
            line = decode_line(raw)
            if isinstance(line, Profiled):
                return list(line.modules.t_d)
    raise RuntimeError(f"{script} reported no profile")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default=",".join(SCRIPTS))
    parser.add_argument("--iters", type=int, default=50, help="profiled iterations")
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        t_d = profile_data_times(SCRIPTS[name], args.iters)
        ms = [1000 * t for t in t_d]
        priors = ", ".join(f"N={n}: {1000 * wait_from_data_spread(t_d, n):.3f}" for n in (2, 4, 8))
        print(f"{name}: T_d mean {statistics.fmean(ms):.2f} ms, sd {statistics.stdev(ms):.3f} ms "
              f"over {len(ms)} iterations; E[max of N] - E[T_d] (ms) {priors}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
