"""``hops experiment traces``: every policy on the first jobs of each
ElasticFlow trace, arrivals compressed to a set offered load (issue 22; the
rule of :mod:`experiments.traces.load`)."""

from __future__ import annotations

import msgspec

from experiments.common.simrun import RunSpec, prepare
from experiments.common.suite import Experiment
from experiments.traces.load import TARGET, compression
from simulator.workloads import trace_reference

TRACES = tuple(f"elasticflow-cluster0{i}" for i in range(1, 5))
TRACE_JOBS = 1000  # the first N jobs of each trace (the rule of experiments/traces/load.py)


def define_traces(seed: int, traces: str | None, first_n: int,
                  policies: tuple[str, ...], load: float = TARGET) -> Experiment:
    """Every policy on the first ``first_n`` jobs of each trace, arrivals
    compressed to offer ``load`` x the cluster's GPUs by the rule of
    :mod:`experiments.traces.load` (its ``TARGET`` unless told otherwise)."""
    if not load > 0:
        raise ValueError(f"the traces' load must be above 0, not {load:g}")
    names = tuple(t for t in (traces or ",".join(TRACES)).split(",") if t)
    runs: list[tuple[str, RunSpec]] = []
    for trace in names:
        base = RunSpec(cluster="paper-sim-512", workload=trace, seed=seed, first_n=first_n)
        cluster, truth, jobs = prepare(base)
        factor = compression(jobs, truth, cluster, trace_reference(cluster, truth), load)
        short = trace.removeprefix("elasticflow-")
        runs += [(f"{short}/{p}", msgspec.structs.replace(base, policy=p, compress=factor))
                 for p in policies]
    title = (f"ElasticFlow traces, first {first_n} jobs each, arrivals compressed to "
             f"{load:g}x the cluster's GPUs")
    return Experiment("traces", title, tuple(runs))
