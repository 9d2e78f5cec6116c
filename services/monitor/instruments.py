"""The monitor's own ``prometheus_client`` registry: the histograms and the
counters that events feed (:mod:`services.monitor.observe` says what to
observe), beside the families each scrape computes from the buckets
(:mod:`services.monitor.metrics`), which :class:`services.monitor.exposition.
MetricsServer` adds to the same registry.

A registry of its own, not the client's global one: the monitor exports
Hops' metrics only, and tests may run several monitors in one process.
"""

from __future__ import annotations

from collections.abc import Iterable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.monitor import observe as ob

# Queue wait and forecast error: seconds to a day; solve time and admission:
# a millisecond to a minute (a plan of 2,000 jobs takes seconds).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
SOLVE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ADMISSION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Instruments:
    """The event-fed histograms and counters in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # No ``_created`` series: the monitor's counters all start with it,
        # and the extra series would double every counter's.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        r = registry
        self.histograms = {
            ob.QUEUE_WAIT: Histogram(
                ob.QUEUE_WAIT, "Time from a job's submission to its first start, by tenant.",
                ["tenant"], buckets=WAIT_BUCKETS, registry=r),
            ob.ADMISSION: Histogram(
                ob.ADMISSION, "Admission's time from a submit request to its acceptance.",
                buckets=ADMISSION_BUCKETS, registry=r),
            ob.PLAN_SOLVE: Histogram(
                ob.PLAN_SOLVE, "The scheduler leader's time making a plan (policy and reasons).",
                buckets=SOLVE_BUCKETS, registry=r),
            ob.FORECAST_ERROR: Histogram(
                ob.FORECAST_ERROR, "At a job's first start, how far its last forecast start "
                "was from it.", buckets=WAIT_BUCKETS, registry=r),
        }
        self.counters = {
            ob.RESTARTS: Counter(ob.RESTARTS, "Starts of jobs that had started before "
                                 "(after a stop or a resize), by tenant.", ["tenant"],
                                 registry=r),
            ob.PREEMPTIONS: Counter(ob.PREEMPTIONS, "Running jobs stopped by the scheduler "
                                    "(a receipt on the timeline), by rule.", ["rule"],
                                    registry=r),
            ob.REFUSALS: Counter(ob.REFUSALS, "Refused requests and plans (error records "
                                 "with a refusal code), by code.", ["code"], registry=r),
        }
        for rule in ob.PREEMPTION_RULES:  # every rule listed, at 0 until it stops a job
            self.counters[ob.PREEMPTIONS].labels(rule=rule)
        for code in ob.REFUSAL_LABELS:
            self.counters[ob.REFUSALS].labels(code=code)

    def apply(self, observations: Iterable[ob.Observation]) -> None:
        for o in observations:
            labels = dict(o.labels)
            if o.kind == "histogram":
                h = self.histograms[o.metric]
                (h.labels(**labels) if labels else h).observe(o.value)
            else:
                c = self.counters[o.metric]
                (c.labels(**labels) if labels else c).inc(o.value)

    def names(self) -> set[str]:
        """The names of every family in the registry (as a scrape shows them)."""
        return {m.name for m in self.registry.collect()}
