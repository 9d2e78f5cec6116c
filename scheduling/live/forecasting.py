"""The forecast as a task for another process (:mod:`scheduling.forecast`).

The leader runs :func:`scheduling.forecast.forecast` in a single-worker
process pool, off its planning path: the planning thread then shares no
interpreter lock with it. What goes to the worker and back are msgpack
bytes (:func:`task_bytes`, :func:`run`, :func:`decode_result`), so the
pool pickles nothing but bytes.

The task carries what the policy and the leader know beyond the snapshot:
the calibration (the leader's :class:`scheduling.forecast.tracking.Tracker`),
the replan delay (``fill_s``), the policy's ``r_num``, each running job's
start (:func:`started`) and, under HiveD, each tenant's servers
(:func:`tenant_servers`). The worker returns the forecast as the draws made
it (the calibration's residuals are taken on it) and as calibrated (shown).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from scheduling.cells import TenantView
from scheduling.forecast import Calibration, calibrated, forecast
from scheduling.forecast.queue import FILL_S
from scheduling.forecast.tracking import Tracker, resolved
from scheduling.live.state import LiveJobRecord
from shared import events as ev
from shared.explain import QueueForecast
from shared.ids import JobId, ServerId, TenantId
from shared.job import R_NUM
from shared.snapshot import Plan, Snapshot


class ForecastTask(msgspec.Struct, frozen=True, kw_only=True):
    """One forecast: the snapshot, the plan made from it, the round's length
    and the seed (the round number: the same round forecasts the same), and
    the settings of :func:`scheduling.forecast.forecast` the leader knows."""

    snapshot: Snapshot
    plan: Plan
    round_s: float
    seed: int
    calibration: Calibration | None = None
    fill_s: float = FILL_S
    r_num: int = R_NUM
    started: dict[JobId, float] = msgspec.field(default_factory=dict)
    tenant_cells: dict[TenantId, frozenset[ServerId]] | None = None


class ForecastResult(msgspec.Struct, frozen=True, kw_only=True):
    """The forecast as the draws made it (``raw``) and as shown (calibrated)."""

    raw: QueueForecast
    shown: QueueForecast


_TASK = msgspec.msgpack.Decoder(ForecastTask)
_RESULT = msgspec.msgpack.Decoder(ForecastResult)


def task_bytes(snapshot: Snapshot, plan: Plan, round_s: float, seed: int, *,
               calibration: Calibration | None = None, fill_s: float = FILL_S,
               r_num: int = R_NUM, started: Mapping[JobId, float] | None = None,
               tenant_cells: Mapping[TenantId, frozenset[ServerId]] | None = None) -> bytes:
    return msgspec.msgpack.encode(ForecastTask(
        snapshot=snapshot, plan=plan, round_s=round_s, seed=seed, calibration=calibration,
        fill_s=fill_s, r_num=r_num, started=dict(started or {}),
        tenant_cells=dict(tenant_cells) if tenant_cells is not None else None))


def run(data: bytes) -> bytes:
    """The worker's side: the forecast of the task ``data`` encodes, as a
    :class:`ForecastResult`."""
    task = _TASK.decode(data)
    raw = forecast(task.snapshot, task.plan, round_s=task.round_s, seed=task.seed,
                   fill_s=task.fill_s, r_num=task.r_num, started=task.started,
                   tenant_cells=task.tenant_cells)
    cal = task.calibration
    shown = calibrated(raw, cal, task.round_s) if cal is not None else raw
    return msgspec.msgpack.encode(ForecastResult(raw=raw, shown=shown))


def decode_result(data: bytes) -> QueueForecast:
    """The forecast as shown (calibrated)."""
    return _RESULT.decode(data).shown


def decode_results(data: bytes) -> ForecastResult:
    """The forecast as the draws made it and as shown."""
    return _RESULT.decode(data)


def started(records: Mapping[JobId, LiveJobRecord]) -> dict[JobId, float]:
    """Each running job's start: when its current run began (its record's
    ``since``, which a start, a stop or a resize moves)."""
    return {k: r.since for k, r in records.items() if r.phase == "running"}


def tenant_servers(views: Iterable[TenantView]) -> dict[TenantId, frozenset[ServerId]]:
    """Each tenant's servers, from its view of the cells: those of its bound
    cells, for the tenants whose reserved cells are all bound (a tenant with
    cells still unbound may bind them anywhere, so it is not restricted)."""
    out: dict[TenantId, frozenset[ServerId]] = {}
    for v in views:
        if any(c.unbound_gpus for c in v.chains) or v.low_priority:
            continue
        out[TenantId(v.tenant)] = frozenset(
            s.server for c in v.chains for cell in c.bound for s in cell.servers)
    return out


def resolve_event(t: Tracker, rec: LiveJobRecord, event: ev.JobEvent, scale: float) -> bool:
    """Resolve in ``t`` the open forecasts ``event`` settles, at its own
    time (a standby that applies it again resolves the same): a start of
    the job's run (not of a profiling run: ``rec``, as the event left it,
    is running) its start forecasts, its finish its finish forecasts.
    Whether ``t`` changed; an event delivered again finds nothing open."""
    if isinstance(event, ev.JobStarted) and rec.phase == "running":
        return bool(resolved(t, event.job_id, event.at, finished=False, scale=scale))
    if isinstance(event, ev.JobFinished):
        return bool(resolved(t, event.job_id, event.at, finished=True, scale=scale))
    return False
