"""The leader's explanations on the bus (docs/events.md, "Reasons, receipts
and timelines"): each job's reason, receipt and forecast in KV
``hops_explain``, its timeline on stream ``HOPS_TIMELINE``, and both on its
tenant's feed.

After each published plan the leader hands the plan, with its reasons
(:func:`scheduling.explain.with_reasons`), to :meth:`Explainer.after_plan`:
the reasons of the jobs the snapshot left out come from their records, a
first plan's stops get receipts (:func:`scheduling.explain.receipts`), and
the forecast (:mod:`scheduling.live.forecasting`) starts in a one-worker
process pool, unless the last one is still running; when it ends, the
records that changed are written. The decisions are
:mod:`scheduling.live.explain`'s; here is the I/O.

A new leader reads the bucket (:meth:`Explainer.load`), so its queue view
answers as its predecessor's did, and reasons keep their ``since``.

The forecast's calibration (:class:`scheduling.forecast.tracking.Tracker`:
the residuals and each job's open forecasts) is kept in the object store
``hops_state`` as object :data:`CALIBRATION_KEY`: a forecast that returns
opens its jobs' forecasts, a job's start or finish event resolves them
(:func:`scheduling.live.forecasting.resolve_event`), and after each change
the state is written (JSON, compressed, :func:`services.runtime.objects.put_object`).
A new leader loads it with the records (from ``hops_explain``'s
:data:`CALIBRATION_KEY`, in compressed parts, where earlier versions kept
it, if there is no object yet), so its forecasts are calibrated as its predecessor's would have
been. Its size is bounded: the residuals per band
(:attr:`~scheduling.forecast.Calibration.limit`), :data:`OPEN_PER_JOB`
open forecasts per job, and only for jobs that have not ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ProcessPoolExecutor

import msgspec
from nats.js.kv import KeyValue
from structlog.typing import FilteringBoundLogger

from scheduling.explain import receipts
from scheduling.forecast import tracking
from scheduling.forecast.queue import FILL_S
from scheduling.live import explain as xp
from scheduling.live import forecasting
from scheduling.live.state import LiveJobRecord
from services.runtime.kv import unpack
from services.runtime.objects import ObjectError, put_object, read_retried
from services.runtime.service import ServiceContext
from services.scheduler.forecast_worker import orphan_guard
from services.scheduler.kv import read_bucket
from shared import events as ev
from shared import subjects
from shared.explain import (
    CALIBRATION_KEY,
    JobExplain,
    JobForecast,
    Receipt,
    TimelineEntry,
    Why,
    reserved_key,
)
from shared.explain_events import for_tenant
from shared.ids import JobId, ServerId, TenantId
from shared.job import R_NUM
from shared.jobkeys import local_id
from shared.snapshot import Plan, Snapshot

OPEN_PER_JOB = 8  # open forecasts kept per job, the newest
# Seconds a plan's explanation may take (its writes and publishes) before it
# is given up, logged, and left to the next plan.
EXPLAIN_BUDGET_S = 10.0
Records = Callable[[], Mapping[JobId, LiveJobRecord]]
Cells = Callable[[], Mapping[TenantId, frozenset[ServerId]] | None]


class Explainer:
    """One term's explanations; see the module docstring."""

    def __init__(self, ctx: ServiceContext, log: FilteringBoundLogger, term: int,
                 round_s: float, records: Records, *, fill_s: float = FILL_S,
                 r_num: int = R_NUM, cells: Cells = lambda: None) -> None:
        self.ctx, self.log, self.term, self.round_s = ctx, log, term, round_s
        self.records = records  # the leader's job records, as they are now
        self.fill_s, self.r_num = fill_s, r_num  # the replan delay, the policy's r_num
        self.cells = cells  # each tenant's servers (HiveD), or None
        self.tracker = tracking.Tracker(per_job=OPEN_PER_JOB)
        self.explained: dict[JobId, JobExplain] = {}  # what hops_explain holds
        self.whys: dict[JobId, Why] = {}
        self.receipts: dict[JobId, Receipt] = {}
        self.forecasts: dict[JobId, JobForecast] = {}
        self.throughputs: tuple[dict[JobId, float], dict[JobId, float]] = ({}, {})
        self.receipted: set[JobId] = set()  # stopped with a receipt, its stop not yet seen
        self.round = 0
        self.kv: KeyValue | None = None
        self.pool: ProcessPoolExecutor | None = None
        self.running: asyncio.Task[None] | None = None
        self.forecasts_skipped = 0
        self.writing = asyncio.Lock()  # one write at a time: the latest state wins

    async def open(self) -> None:
        self.kv = await self.ctx.js.key_value(subjects.KV_EXPLAIN)

    async def load(self) -> None:
        """Every job's record of ``hops_explain``, as the last leader left them."""
        values = await read_bucket(self.ctx.js, subjects.KV_EXPLAIN)
        await self._load_tracker({k: d for k, (d, _) in values.items() if reserved_key(k)})
        for key, (data, _) in values.items():
            if reserved_key(key):  # the calibration and its parts
                continue
            try:
                e = msgspec.json.decode(data, type=JobExplain)
            except msgspec.DecodeError as err:
                self.log.warning("bad KV entry", bucket=subjects.KV_EXPLAIN, key=key,
                                 error=str(err))
                continue
            self.explained[JobId(key)] = e
            if e.why is not None:
                self.whys[JobId(key)] = e.why
            if e.receipt is not None:
                self.receipts[JobId(key)] = e.receipt
            if e.forecast is not None:
                self.forecasts[JobId(key)] = e.forecast
            self.round = max(self.round, e.round)

    async def _load_tracker(self, legacy: Mapping[str, bytes]) -> None:
        """The calibration as the last leader left it: its object, else
        ``legacy`` (``hops_explain``'s reserved keys, earlier versions);
        none or unreadable: a fresh one."""
        try:
            data = await read_retried(self.ctx.js, subjects.OBJ_STATE, CALIBRATION_KEY)
            if data is None and CALIBRATION_KEY in legacy:
                data = unpack(CALIBRATION_KEY, legacy)
            if data is None:
                return
            self.tracker = tracking.decode(data)
            self.tracker.per_job = OPEN_PER_JOB
        except (ValueError, ObjectError, msgspec.DecodeError) as err:  # uncalibrated
            self.log.warning("calibration unreadable", error=str(err))

    def close(self) -> None:
        if self.running is not None:
            self.running.cancel()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    # --- job events ---------------------------------------------------------------

    async def on_event(self, rec: LiveJobRecord, event: ev.JobEvent, feed: bool = True) -> None:
        """A job event the leader applied: its timeline entry (a stop its
        receipt told already has none), and on the tenant's feed if ``feed``
        (as the event itself: not again for an event delivered again that
        changed nothing). The timeline gets it on every delivery: a leader
        killed before it stored the entry never acked the event, and the
        entry's message id stores a repeat once."""
        if isinstance(event, ev.JobStarted | ev.JobResized):
            self.receipted.discard(event.job_id)
        if forecasting.resolve_event(self.tracker, rec, event, self.round_s):
            await self.save_tracker()
        if isinstance(event, ev.JobStopped) and event.job_id in self.receipted:
            self.receipted.discard(event.job_id)
            return
        entry = xp.event_entry(event)
        if entry is not None:
            await self.publish(entry, feed)

    # --- plans ---------------------------------------------------------------------

    async def after_plan(self, snapshot: Snapshot, plan: Plan, round_no: int, *,
                         drained: Collection[ServerId], lost: Collection[ServerId]) -> None:
        """The reasons, receipts and ``hops_explain`` records of a published
        plan, and its forecast started (see the module docstring). A failure
        is logged: the plan is out, and the next one explains again. It is
        bounded (:data:`EXPLAIN_BUDGET_S`): the leader's next plan never
        waits on an explanation."""
        try:
            await asyncio.wait_for(self._after_plan(snapshot, plan, round_no, drained, lost),
                                   EXPLAIN_BUDGET_S)
        except Exception as e:  # TimeoutError included
            self.log.warning("plan not explained", round=round_no, error=repr(e))

    async def _after_plan(self, snapshot: Snapshot, plan: Plan, round_no: int,
                          drained: Collection[ServerId], lost: Collection[ServerId]) -> None:
        started, now, records = time.perf_counter(), snapshot.now, self.records()
        self.round = round_no
        whys = xp.job_whys(plan, snapshot, records, self.whys, now)
        reasons = xp.reason_entries(self.whys, whys, now)
        self.whys = whys
        stops = [self._receipt(r) for r in (
            receipts(snapshot, plan, drained=drained, lost=lost, round_no=round_no)
            if snapshot.first_plan else ())]
        self.throughputs = xp.throughputs(snapshot, plan)
        await self.publish_all(stops)  # a stopped job's stop comes before its reason
        await self.publish_all(reasons)
        await self.write(now)
        self._forecast(snapshot, plan, round_no)
        self.log.debug("plan explained", round=round_no, reasons=len(whys),
                       spent_s=round(time.perf_counter() - started, 4))

    async def time_limit(self, job_id: JobId, now: float) -> None:
        """The receipt of a job the leader ended at its time limit (a failure
        is logged: the job was ended all the same)."""
        rec = self.records().get(job_id)
        if rec is None:
            return
        try:
            await self._time_limit(rec, now)
        except Exception as e:
            self.log.warning("time limit not explained", job_id=job_id, error=repr(e))

    async def _time_limit(self, rec: LiveJobRecord, now: float) -> None:
        job_id = rec.job_id
        receipt = Receipt(job_id=job_id, at=now, rule="TimeLimit",
                          message=f"it reached its time limit of {rec.spec.time_limit:g} s",
                          samples_kept=rec.samples_done,
                          total_samples=float(rec.spec.total_samples), round=self.round)
        await self.publish(self._receipt(receipt))
        await self.write(now)

    def _receipt(self, receipt: Receipt) -> TimelineEntry:
        receipt = xp.with_resume(receipt, self.forecasts.get(receipt.job_id))
        self.receipts[receipt.job_id] = receipt
        self.receipted.add(receipt.job_id)
        return xp.receipt_entry(receipt)

    # --- the forecast ------------------------------------------------------------

    def _forecast(self, snapshot: Snapshot, plan: Plan, round_no: int) -> None:
        """Start the forecast of ``plan`` in the pool, unless one still runs."""
        if self.running is not None and not self.running.done():
            self.forecasts_skipped += 1
            return
        if self.pool is None:
            methods = multiprocessing.get_all_start_methods()
            method = "forkserver" if "forkserver" in methods else "spawn"
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method),
                                            initializer=orphan_guard)
        records = self.records()
        # the miss levels learn of long waits while they go on, and this
        # round's correction counts the known misses (tracking.current)
        tracking.known_misses(self.tracker, snapshot.now)
        calibration = tracking.current(self.tracker, snapshot.now, self.round_s)
        data = forecasting.task_bytes(
            snapshot, plan, self.round_s, round_no, calibration=calibration,
            fill_s=self.fill_s, r_num=self.r_num, started=forecasting.started(records),
            tenant_cells=self.cells())
        starts = frozenset(a.job_id for a in plan.assignments)
        self.running = asyncio.create_task(self._forecast_in_pool(data, starts))

    async def _forecast_in_pool(self, data: bytes, starts: frozenset[JobId]) -> None:
        assert self.pool is not None
        started = time.monotonic()
        try:
            # submitted from a thread: the pool's first submission starts its
            # worker process, which must not hold up the event loop
            pool = self.pool
            future = await asyncio.to_thread(pool.submit, forecasting.run, data)
            out = await asyncio.wrap_future(future)
            result = forecasting.decode_results(out)
            forecast = result.shown
            records = self.records()
            tracking.opened(self.tracker, result.raw, starts, shown=forecast)
            for job_id in (k for k, r in records.items() if r.phase == "running"):
                # it started while the forecast ran: that start was not of it
                self.tracker.open_start.pop(job_id, None)
            tracking.kept(self.tracker, [k for k, r in records.items() if not r.final])
            await self.save_tracker()
            moved = xp.forecast_entries(self.forecasts, forecast, self.round_s)
            await self.publish_all([e for e in moved if e.job_id in records
                                    and not records[e.job_id].final])
            self.forecasts.update({f.job_id: f for f in forecast.jobs})
            self.receipts.update(xp.resumed(self.receipts, self.forecasts))
            await self.write(forecast.at)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a failed forecast leaves the last one standing
            self.log.warning("forecast failed", error=repr(e))
            return
        self.log.debug("forecast done", jobs=len(forecast.jobs),
                       spent_s=round(time.monotonic() - started, 3))

    # --- writing -----------------------------------------------------------------

    async def write(self, now: float) -> None:
        """Write the ``hops_explain`` records that changed; delete those of
        jobs that ended."""
        async with self.writing:
            await self._write(now)

    async def _write(self, now: float) -> None:
        records = self.records()
        live = [k for k, r in records.items() if not r.final]
        self.forecasts = {k: f for k, f in self.forecasts.items() if k in records}
        estimated, measured = self.throughputs
        new = xp.explains(live, xp.Sources(
            at=now, round=self.round, term=self.term, whys=self.whys, receipts=self.receipts,
            forecasts=self.forecasts, estimated=estimated, measured=measured))
        kv = self.kv
        assert kv is not None, "Explainer.open first"
        changed = xp.changed(self.explained, new)
        await asyncio.gather(*(kv.put(k, msgspec.json.encode(e)) for k, e in changed.items()))
        self.explained.update(changed)
        for job_id in [k for k in self.explained if k not in new]:
            with contextlib.suppress(Exception):
                await kv.delete(job_id)
            self.explained.pop(job_id, None)
            self.receipts.pop(job_id, None)

    async def save_tracker(self) -> None:
        """Write the calibration state (object :data:`CALIBRATION_KEY`). A
        failed write is logged: the next change writes it again."""
        async with self.writing:
            try:
                await put_object(self.ctx.js, subjects.OBJ_STATE, CALIBRATION_KEY,
                                 tracking.encode(self.tracker))
            except Exception as e:
                self.log.warning("calibration not written", error=repr(e))

    async def publish_all(self, entries: list[TimelineEntry]) -> None:
        """Each of ``entries``, their acks awaited together (a plan's reasons
        may be many: the next plan should not wait for them one by one)."""
        await asyncio.gather(*(self.publish(e) for e in entries))

    async def publish(self, entry: TimelineEntry, feed: bool = True) -> None:
        """``entry`` on its job's timeline and, if ``feed``, on its tenant's
        feed; a failed publish is logged, never fails the leader."""
        try:
            await self.ctx.js.publish(subjects.timeline(entry.job_id),
                                      msgspec.json.encode(entry),
                                      headers={"Nats-Msg-Id": xp.entry_id(entry)})
        except Exception as e:
            self.log.warning("timeline publish failed", job_id=entry.job_id, error=repr(e))
        records = self.records()
        rec = records.get(entry.job_id)
        if rec is None or not feed:
            return
        tenant = rec.spec.tenant

        def visible(j: JobId) -> bool:
            other = records.get(j)
            return other is not None and other.spec.tenant == tenant

        try:
            subject = subjects.tenant_events(tenant, local_id(entry.job_id))
            shown = for_tenant(entry, visible, lambda j: JobId(local_id(j)))
            await self.ctx.nc.publish(subject, ev.encode(shown))
        except Exception as e:  # the feed is a convenience, as for job events
            self.log.warning("tenant feed publish failed", job_id=entry.job_id, error=repr(e))

