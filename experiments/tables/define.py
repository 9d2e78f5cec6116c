"""The paper's comparisons as named experiments (Hops §4.2-4.6): Table 3,
Table 4, the queue priorities (Figure 13), the arrival rates (§4.6), an
ElasticFlow trace, and the four traces at a set load
(:mod:`experiments.traces.define`). Each is a list of simulation runs that
:func:`experiments.common.suite.run_experiment` executes.
"""

from __future__ import annotations

import msgspec

from experiments.common.simrun import RunSpec
from experiments.common.suite import Experiment, PaperRow
from experiments.traces.define import TRACE_JOBS, define_traces
from experiments.traces.load import TARGET
from scheduling.registry import POLICIES as REGISTERED
from scheduling.registry import parse_policy

# Table 3 (physical, 64 GPUs) and Table 4 (simulated, 512 GPUs) of the paper:
# makespan h, avg JCT h, avg wait h, max LR, avg fragments per round.
PAPER: dict[str, dict[str, PaperRow]] = {
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
# The baselines operators run (docs/baselines.md), compared by default on the
# traces and Table 4: a 1,000-job trace run of each takes under two minutes.
OPERATORS = ("slurm", "tiresias", "themis")
DEFAULT_POLICIES: dict[str, tuple[str, ...]] = {
    "traces": (*POLICIES, *OPERATORS), "table4": (*POLICIES, *OPERATORS)}
PRIORITIES = ("lr", "las", "sjf", "srtf", "ftf", "fifo")
RATES = (30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
# Requirement-set generators: the project's rule (an assumption) or §4.2 read
# literally (simulator/generators.py); the suffix of the generator's name.
GENERATOR_CHOICES = ("project", "literal")


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


def default_policies(name: str) -> tuple[str, ...]:
    """The policies experiment ``name`` compares when none are named."""
    return DEFAULT_POLICIES.get(name, POLICIES)


def define(name: str, seed: int = 0, trace: str | None = None, first_n: int | None = None,
           compress: float = 1.0, rates: tuple[float, ...] = RATES,
           policies: tuple[str, ...] | None = None, generator: str = "project",
           load: float | None = None) -> Experiment:
    """The runs of experiment ``name``; ``first_n`` and ``compress`` apply to
    every run's workload. ``policies`` are the specs compared (each run's
    label is its spec; none: :func:`default_policies`); ``priorities``
    varies the queue priority of the first.
    ``generator`` picks the requirement sets of the paper's workloads:
    ``project`` (paper-physical, paper-sim) or ``literal`` (their
    ``-literal`` twins); it does not apply to a trace (``elasticflow``).
    ``load``: the offered load ``traces`` compresses to (none: the rule's
    :data:`experiments.traces.load.TARGET`); the others refuse it."""
    if generator not in GENERATOR_CHOICES:
        raise ValueError(f"unknown generator {generator!r}; known: "
                         f"{', '.join(GENERATOR_CHOICES)}")
    if name == "elasticflow" and generator != "project":
        raise ValueError(f"generator {generator!r} does not apply to 'elasticflow': "
                         "its requirement sets come from the trace")
    if name == "traces" and generator != "project":
        raise ValueError(f"generator {generator!r} does not apply to 'traces': "
                         "their requirement sets come from the traces")
    if load is not None and name != "traces":
        raise ValueError(f"a load does not apply to {name!r}: its arrivals are its "
                         "workload's (--compress, --rates)")
    policies = policies or default_policies(name)
    for p in policies:
        parse_policy(p)  # a bad spec fails before the first run
    if name == "traces":
        return define_traces(seed, trace, first_n or TRACE_JOBS, policies,
                             TARGET if load is None else load)
    exp = _define(name, seed, trace, rates, policies, WORKLOAD_SUFFIX[generator])
    if generator == "literal":
        exp = msgspec.structs.replace(exp, title=f"{exp.title}, §4.2's literal requirement sets")
    runs = tuple(
        (label, msgspec.structs.replace(spec, first_n=first_n or spec.first_n,
                                        compress=compress if compress != 1.0 else spec.compress))
        for label, spec in exp.runs
    )
    paper = tuple(PAPER.get(name, {}).items())
    return msgspec.structs.replace(exp, runs=runs, paper=paper)


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
