"""The paper's experiments, one folder each: its workload, rules, runs and
report. :mod:`experiments.catalog` maps ``hops experiment NAME`` to them;
:mod:`experiments.common` holds what they share."""
