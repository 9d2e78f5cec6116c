"""Cluster metrics (pure) and their Prometheus text rendering.

From the KV buckets (``hops_nodes``, ``hops_alloc``, ``hops_jobs``), read
once per scrape as a :class:`ClusterState` (:mod:`services.monitor.scrape`),
and what the monitor counted. Each gauge is defined as the API shows the
same thing (docs/events.md, "Metrics"):

* queue length and jobs per phase (``/jobs?phase=``); running jobs are the
  jobs in phase ``running``, as ``hops_jobs{phase="running"}``;
* profiling runs: the (job, server) runs of mode ``profile`` in
  ``hops_alloc`` on alive servers, each holding GPUs there (a job in phase
  ``profiling`` may be waiting for its run: that is
  ``hops_jobs{phase="profiling"}``); placements per mode;
* nodes alive and lost, and the drained ones among the alive (as
  ``/cluster``'s ``alive_servers`` counts a drained node alive);
* GPUs of alive nodes, GPUs booked, utilisation, and the booked share per
  GPU type (``hops_gpus_booked_ratio{gpu_type}``); and per resource (GPUs,
  CPU cores, memory in MiB) the capacity of the alive nodes and what the
  placements in ``hops_alloc`` hold there;
* fragmentation: idle GPUs while some job waits, as in §4.2 (0 when the
  queue is empty);
* the latency ratio (Eq. 6/8, wait/age) of finished jobs, maximum and mean,
  and RAQLR (Eq. 7): the mean latency ratio of the jobs that finished
  within the last ``window_h`` hours (``scheduling.fairness.raqlr``);
* jobs that ended, by outcome (finished, failed, cancelled);
* error records seen, per service, and the refusals among them (codes
  ``forbidden``, ``unauthorized``, ``plan_refused``), per service and code; plan entries
  the placer skipped because the cluster changed since the plan (benign
  races, not errors), per reason;
* the revision of each bucket the scrape read, so that a reader can tell
  whether two scrapes saw the same records.

Latency ratios are the scheduler's own: :class:`LatencyBook` keeps the
last value the scheduler's queue view (``hops.v1.queue``) showed for each
job, which is its final one up to the polling period, since the ratio only
grows while the job waits. A job never seen waiting counts 0 (it did not
wait). The book lives in memory: it restarts empty with the monitor.

The families are rendered by ``prometheus_client`` (:func:`render`,
:func:`to_prometheus`); the histograms and the counters fed by events are
:mod:`services.monitor.observe`'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scheduling.fairness import raqlr
from shared.ids import JobId, ServerId
from shared.records import JobPhase, JobRecord, NodeRecord, Placement, QueueEntry
from shared.resources import RESOURCE_NAMES, Resources, total
from shared.wire import FORBIDDEN, PLAN_REFUSED, UNAUTHORIZED

MetricType = Literal["gauge", "counter"]
Outcome = Literal["finished", "failed", "cancelled"]
OUTCOMES: tuple[str, ...] = get_args(Outcome)
PHASES: tuple[str, ...] = get_args(JobPhase)
# The error-record codes that are refusals: of an identity (the audit), and
# of a plan that over-allocated (the scheduler leader's plan check).
REFUSAL_CODES = frozenset({FORBIDDEN, UNAUTHORIZED, PLAN_REFUSED})


class LatencyBook:
    """Latency ratios: the last one seen per waiting job, and the finished
    jobs'; the jobs that ended, by outcome."""

    def __init__(self, max_finished: int = 100_000) -> None:
        self.max_finished = max_finished
        self.last: dict[JobId, float] = {}
        self.finished: list[tuple[float, float]] = []  # (end time, latency ratio)
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self._done: set[JobId] = set()

    def observe(self, entries: Iterable[QueueEntry]) -> None:
        for e in entries:
            if e.job_id not in self._done and math.isfinite(e.latency_ratio):
                self.last[e.job_id] = e.latency_ratio

    def ended(self, job: JobId, at: float, outcome: Outcome) -> None:
        """The job reached a final phase (once per job, however often it is
        delivered); a finished one enters Eq. (7)."""
        lr = self.last.pop(job, 0.0)
        if job in self._done:
            return
        self._done.add(job)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome == "finished":
            self.finished.append((at, lr))
            del self.finished[: max(0, len(self.finished) - self.max_finished)]

    def max_lr(self) -> float:
        return max((lr for _, lr in self.finished), default=0.0)

    def mean_lr(self) -> float:
        return sum(lr for _, lr in self.finished) / len(self.finished) if self.finished else 0.0


@dataclass(frozen=True)
class ClusterState:
    """The three buckets as one scrape read them, with each one's revision."""

    nodes: Mapping[ServerId, NodeRecord]
    placements: Mapping[JobId, Placement]
    jobs: Mapping[JobId, JobRecord]
    revisions: Mapping[str, int]


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Family:
    name: str
    kind: MetricType
    help: str
    samples: tuple[Sample, ...]


def _one(name: str, kind: MetricType, help_text: str, value: float) -> Family:
    return Family(name, kind, help_text, (Sample(name, value),))


def state_metrics(state: ClusterState, book: LatencyBook, errors: Mapping[str, int],
                  now: float, window_h: float) -> list[Family]:
    """Every metric of one scrape's ``state`` at ``now``."""
    return cluster_metrics(state.nodes, state.placements, state.jobs, book, errors, now,
                           window_h, state.revisions)


def cluster_metrics(
    nodes: Mapping[ServerId, NodeRecord],
    placements: Mapping[JobId, Placement],
    jobs: Mapping[JobId, JobRecord],
    book: LatencyBook,
    errors: Mapping[str, int],
    now: float,
    window_h: float,
    revisions: Mapping[str, int] | None = None,
) -> list[Family]:
    """Every metric at ``now`` (see the module docstring)."""
    alive = {s: n for s, n in nodes.items() if n.alive}
    total = sum(n.server.gpus for n in alive.values())
    used = sum(g for p in placements.values() for s, g in p.configuration.parts if s in alive)
    phases = phase_counts(jobs.values())
    queued = phases["queued"]
    idle = max(0, total - used)
    modes = {m: sum(1 for p in placements.values() if p.mode == m) for m in ("run", "profile")}
    profiles = sum(1 for p in placements.values() if p.mode == "profile"
                   for s in p.configuration.servers if s in alive)
    return [
        _one("hops_queue_length", "gauge", "Jobs waiting in the queue (phase queued).", queued),
        Family("hops_jobs", "gauge", "Jobs in hops_jobs, by phase.", tuple(
            Sample("hops_jobs", n, (("phase", ph),)) for ph, n in sorted(phases.items()))),
        _one("hops_running_jobs", "gauge", "Jobs in phase running.", phases["running"]),
        _one("hops_profiling_runs", "gauge", "Profiling runs (job, server) holding GPUs on "
             "alive servers (§3.2).", profiles),
        Family("hops_placements", "gauge", "Entries of hops_alloc, by mode.", tuple(
            Sample("hops_placements", n, (("mode", m),)) for m, n in sorted(modes.items()))),
        Family("hops_nodes", "gauge", "Registered nodes, by state (drained: the alive "
               "nodes that get no new work, counted among the alive too).", (
            Sample("hops_nodes", len(alive), (("state", "alive"),)),
            Sample("hops_nodes", len(nodes) - len(alive), (("state", "lost"),)),
            Sample("hops_nodes", sum(1 for n in alive.values() if n.drained),
                   (("state", "drained"),)))),
        _one("hops_gpus_alive", "gauge", "GPUs of alive nodes.", total),
        _one("hops_gpus_used", "gauge", "GPUs booked in hops_alloc on alive nodes.", used),
        _one("hops_gpu_utilisation", "gauge", "Booked share of the alive GPUs.",
             used / total if total else 0.0),
        booked_ratio_family(alive, placements),
        _one("hops_fragmented_gpus", "gauge", "Idle GPUs while a job waits (§4.2).",
             idle if queued else 0),
        *_latency_families(book, now, window_h),
        Family("hops_errors_total", "counter", "Error records seen on hops.v1.errors.", tuple(
            Sample("hops_errors_total", n, (("service", svc),))
            for svc, n in sorted(errors.items()))),
        Family("hops_kv_revision", "gauge", "Revision of each bucket this scrape read.", tuple(
            Sample("hops_kv_revision", r, (("bucket", b),))
            for b, r in sorted((revisions or {}).items()))),
        *resource_families(alive, placements),
    ]


def phase_counts(jobs: Iterable[JobRecord]) -> dict[str, int]:
    """Jobs per phase, every phase listed."""
    phases = {ph: 0 for ph in PHASES}
    for rec in jobs:
        phases[rec.phase] = phases.get(rec.phase, 0) + 1
    return phases


def _latency_families(book: LatencyBook, now: float, window_h: float) -> list[Family]:
    return [
        _one("hops_latency_ratio_max", "gauge", "Largest latency ratio of a finished job "
             "(Eq. 6).", book.max_lr()),
        _one("hops_latency_ratio_mean", "gauge", "Mean latency ratio of the finished jobs "
             "(Eq. 6).", book.mean_lr()),
        _one("hops_raqlr", "gauge", f"Recent average queue latency ratio (Eq. 7) over "
             f"{window_h:g} h.", raqlr(book.finished, now, window_h)),
        Family("hops_jobs_finished_total", "counter", "Jobs that ended, by outcome "
               "(finished, failed, cancelled), seen by the monitor.", tuple(
                   Sample("hops_jobs_finished_total", n, (("outcome", o),))
                   for o, n in sorted(book.outcomes.items()))),
    ]


def booked_ratio_family(alive: Mapping[ServerId, NodeRecord],
                        placements: Mapping[JobId, Placement]) -> Family:
    """``hops_gpus_booked_ratio{gpu_type}``: per GPU type, the share of the
    alive nodes' GPUs that placements book (0 for a type with none alive)."""
    gpus: dict[str, int] = {}
    for n in alive.values():
        gpus[n.server.gpu_type] = gpus.get(n.server.gpu_type, 0) + n.server.gpus
    booked = dict.fromkeys(gpus, 0)
    for p in placements.values():
        for s, g in p.configuration.parts:
            if s in alive:
                booked[alive[s].server.gpu_type] += g
    return Family("hops_gpus_booked_ratio", "gauge",
                  "Booked share of the alive nodes' GPUs, per GPU type.", tuple(
                      Sample("hops_gpus_booked_ratio", booked[t] / gpus[t] if gpus[t] else 0.0,
                             (("gpu_type", t),)) for t in sorted(gpus)))


def resource_families(alive: Mapping[ServerId, NodeRecord],
                      placements: Mapping[JobId, Placement]) -> list[Family]:
    """``hops_capacity{resource}`` and ``hops_allocated{resource}``: what the
    alive nodes have and what placements hold on them, per resource."""
    capacity = total(n.server.capacity for n in alive.values())
    held = total(d for p in placements.values()
                 for s, d in p.configuration.demands().items() if s in alive)

    def family(name: str, help_text: str, v: Resources) -> Family:
        return Family(name, "gauge", help_text, tuple(
            Sample(name, v[r], (("resource", r),)) for r in RESOURCE_NAMES))

    return [family("hops_capacity", "What alive nodes have, per resource (memory in MiB).",
                   capacity),
            family("hops_allocated", "What placements hold on alive nodes, per resource "
                   "(memory in MiB).", held)]


def refused_family(refused: Mapping[tuple[str, str], int]) -> Family:
    """``hops_refused_total{service,code}``: refusals each service audited
    (error records with a code of :data:`REFUSAL_CODES`)."""
    return Family("hops_refused_total", "counter",
                  "Refused actions (error records with code forbidden, unauthorized or "
                  "plan_refused).",
                  tuple(Sample("hops_refused_total", n, (("service", svc), ("code", code)))
                        for (svc, code), n in sorted(refused.items())))


def skipped_family(skipped: Mapping[str, int]) -> Family:
    """``hops_placer_skipped_total{reason}``: plan entries the placer skipped
    because the cluster changed since the plan was made (benign races)."""
    return Family("hops_placer_skipped_total", "counter",
                  "Plan entries the placer skipped as overtaken by events (not errors).",
                  tuple(Sample("hops_placer_skipped_total", n, (("reason", r),))
                        for r, n in sorted(skipped.items())))


def to_prometheus(families: Iterable[Family]) -> list[Metric]:
    """``families`` as ``prometheus_client`` metric families (a counter's
    family is named without its ``_total``, as the client wants)."""
    out: list[Metric] = []
    for f in families:
        m = Metric(f.name.removesuffix("_total") if f.kind == "counter" else f.name, f.help,
                   f.kind)
        for sample in f.samples:
            m.add_sample(sample.name, dict(sample.labels), sample.value)
        out.append(m)
    return out


class Families(Collector):
    """A collector of fixed families (what one scrape computed)."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def render(families: Iterable[Family]) -> str:
    """The Prometheus text exposition format, by ``prometheus_client``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(to_prometheus(families)))
    return generate_latest(registry).decode()
