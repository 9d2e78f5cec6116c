"""Why a job waits, why it stopped, and when it should start and finish:
the wire contract of explainable scheduling (docs/explain.md).

- :class:`Why`: one job's primary reason in one plan, a code from the closed
  set :data:`REASON_CODES` plus the details that make it actionable. The pure
  core computes it (:mod:`scheduling.explain`); the plan carries one per job
  that is not running (``PlanReasons.why``), each layer its own
  (``LayerRecord.why``).
- :class:`Receipt`: why a running job was stopped (:data:`STOP_RULES`), who
  took its GPUs, the progress it kept and when it should resume.
- :class:`JobForecast`: a job's position and its estimated start and finish
  with a 10th-90th percentile interval, and up to three :class:`WhatIf`
  alternatives (:mod:`scheduling.forecast`).
- :class:`TimelineEntry`: one line of a job's durable history (stream
  ``HOPS_TIMELINE``).
- :class:`JobExplain`: what KV ``hops_explain`` holds per job (key: the job
  key), written by the leader, read by the gateway and the standby.

Messages never carry another job's id in their text: the ids a reason names
are in ``jobs`` and :func:`render` writes them, so a tenant's view can say
"another tenant's job" instead (``visible``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeAlias, get_args

import msgspec

from shared.ids import GpuType, JobId

ReasonCode: TypeAlias = Literal[
    "Profiling",  # some GPU types are still to be profiled (which: types)
    "WaitingForPlan",  # arrived after this round's first plan (next_plan_at)
    "NoEstimate",  # profiled, but no estimator gave it a throughput estimate
    "OutsideWindow",  # ranked outside the service window (rank, window)
    "Priority",  # in the window; higher-priority jobs took what it needs (jobs, ratios)
    "Resources",  # no configuration of its requirement set fits what is free (gpu_type, short)
    "Fragmentation",  # enough free in total, in no shape it accepts (free)
    "TenantCells",  # HiveD: its tenant's virtual cluster has no free cell that fits
    "Quota",  # a quota layer holds it back
    "Cores",  # CODA: the CPU cores it needs are not free
    "Held",  # a user holds it
    "NodeDrained",  # the nodes it could use are drained
    "Unschedulable",  # no alive node has a GPU type it runs on
]
REASON_CODES: tuple[str, ...] = get_args(ReasonCode)

StopRule: TypeAlias = Literal[
    "Fairness",  # a first plan gave its GPUs to others (round replan, Eq. 8)
    "CellReclaim",  # HiveD: a guaranteed job of the cells' owner reclaimed them
    "Profiling",  # its GPUs went to profiling runs (§3.2)
    "Drain",  # an operator drained a node it ran on
    "TimeLimit",  # it reached its time limit
    "Resize",  # the plan gave it another configuration (restarted on it)
    "NodeLost",  # a node it ran on stopped answering
]
STOP_RULES: tuple[str, ...] = get_args(StopRule)

ANOTHER_TENANT = "another tenant's job"
# The name of the forecast's calibration state in the object store
# hops_state; earlier versions kept it in hops_explain under this key (and,
# with a ``.part`` suffix, its parts), still read once. A job key never
# contains '.' (admission refuses it in ids and tenant names), so no job
# can take this key.
CALIBRATION_KEY = "forecast.calibration"


def reserved_key(key: str) -> bool:
    """Whether ``key`` of ``hops_explain`` holds no job's entry."""
    return "." in key


class Why(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One job's primary reason in one plan.

    ``message`` is the reason in words without any job id; ``jobs`` are the
    jobs it names (``Priority``: the first few that took what it needs) and
    ``ratios`` their latency ratios, in the same order. ``layer`` names the
    layer that decided ("" for the policy or the mechanism). The other
    fields are the code's details; unused ones keep their defaults."""

    code: ReasonCode
    message: str
    layer: str = ""
    jobs: tuple[JobId, ...] = ()
    ratios: tuple[float, ...] = ()
    types: tuple[GpuType, ...] = ()  # Profiling: the types that remain
    gpu_type: str = ""  # Resources: the type that is short
    short: int = 0  # Resources / Cores: GPUs (cores) short
    free: int = 0  # Fragmentation: GPUs free in total
    rank: int = 0  # OutsideWindow: its rank (1 = first)
    window: int = 0  # OutsideWindow: the window's size
    next_plan_at: float = 0.0  # WaitingForPlan: when the next plan runs (epoch s)
    since: float = 0.0  # when this reason began (kept while the code stays)


class Receipt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Why a running job was stopped: ``rule``, the jobs that took its GPUs
    (``takers``), the progress it kept (``samples_kept`` of
    ``total_samples``) and when it should resume (``resume_at``, from the
    forecast; None: not known yet)."""

    job_id: JobId
    at: float
    rule: StopRule
    message: str
    takers: tuple[JobId, ...] = ()
    samples_kept: float = 0.0
    total_samples: float = 0.0
    resume_at: float | None = None
    round: int = 0


WhatIfKind: TypeAlias = Literal["smaller", "gpu_type", "opportunistic"]


class WhatIf(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One alternative for a waiting job, from the same forecast: with a
    smaller requirement set (``max_gpus``), only on another GPU type
    (``gpu_type``), or as an opportunistic job in other tenants' idle cells."""

    kind: WhatIfKind
    message: str
    start: float
    finish: float
    max_gpus: int = 0
    gpu_type: str = ""


class JobForecast(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A job's place in the queue (1 = next; 0 for a running job), overall
    and within its tenant, and its estimated start and finish (epoch
    seconds) with their 10th-90th percentile intervals; a running job's
    start is when it started."""

    job_id: JobId
    position: int
    tenant_position: int
    start: float
    start_lo: float
    start_hi: float
    finish: float
    finish_lo: float
    finish_hi: float
    whatif: tuple[WhatIf, ...] = ()


class QueueForecast(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One forecast of the whole queue, made at ``at`` from the plan of
    round ``round``, with ``draws`` draws of the throughputs, in ``spent_s``."""

    at: float
    jobs: tuple[JobForecast, ...] = ()
    round: int = 0
    draws: int = 0
    spent_s: float = 0.0


TimelineKind: TypeAlias = Literal[
    "submitted", "profiled", "reason", "started", "stopped", "forecast",
    "finished", "failed", "cancelled", "held", "released",
]


class TimelineEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One line of a job's history (stream ``HOPS_TIMELINE``, subject
    :func:`shared.subjects.timeline`): what happened at ``at``, with the
    reason, receipt or forecast it concerns."""

    job_id: JobId
    at: float
    kind: TimelineKind
    note: str = ""
    why: Why | None = None
    receipt: Receipt | None = None
    forecast: JobForecast | None = None
    v: int = 1


class JobExplain(msgspec.Struct, frozen=True, kw_only=True):
    """``hops_explain[job key]``: the leader's latest word on one job: its
    reason (None while it runs), its last stop's receipt, its forecast, and
    the plan round and lease term they come from."""

    job_id: JobId
    at: float
    why: Why | None = None
    receipt: Receipt | None = None
    forecast: JobForecast | None = None
    round: int = 0
    term: int = 0
    # samples/s of its configuration: as the estimator predicts it (the
    # plan's) and as its heartbeats measure it (0: not known)
    estimated_throughput: float = 0.0
    measured_throughput: float = 0.0
    v: int = 1


def render(why: Why, visible: Callable[[JobId], bool] = lambda _: True) -> str:
    """``why`` in words, naming the jobs it names; a job ``visible`` refuses
    (another tenant's, in a tenant's view) is "another tenant's job"."""
    if not why.jobs:
        return why.message
    names = [
        (f"{j} (latency ratio {r:.3g})" if r else str(j)) if visible(j) else ANOTHER_TENANT
        for j, r in zip(why.jobs, why.ratios or (0.0,) * len(why.jobs), strict=False)
    ]
    return f"{why.message}: {', '.join(names)}"


def render_receipt(receipt: Receipt, visible: Callable[[JobId], bool] = lambda _: True) -> str:
    """``receipt`` in words, its takers named as :func:`render` names jobs."""
    if not receipt.takers:
        return receipt.message
    names = [str(j) if visible(j) else ANOTHER_TENANT for j in receipt.takers]
    return f"{receipt.message}; its GPUs went to {', '.join(names)}"
