"""What feeds the monitor's event-fed metrics (a shell over
:mod:`services.monitor.observe`): job events and plans as the monitor's
consumers deliver them, the stops' receipts on ``HOPS_TIMELINE`` (durable
``monitor-timeline``) and the forecasts in ``hops_explain`` (a watcher).
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry

from services.monitor import observe as ob
from services.monitor.follow import watch_bucket
from services.monitor.instruments import Instruments
from services.runtime.consumer import ConsumerSpec, Delivery, consume
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import ErrorRecord, JobEvent, PlanIssued
from shared.explain import JobExplain, TimelineEntry
from shared.ids import JobId
from shared.records import JobRecord
from shared.wire import INVALID, WireError

TIMELINE_DURABLE = "monitor-timeline"
_TIMELINE = msgspec.json.Decoder(TimelineEntry, strict=False)
_EXPLAIN = msgspec.json.Decoder(JobExplain, strict=False)


def decode_timeline(data: bytes) -> TimelineEntry:
    try:
        return _TIMELINE.decode(data)
    except msgspec.DecodeError as e:
        raise WireError(INVALID, f"invalid timeline entry: {e}") from None


class MetricFeeds:
    """Applies what :mod:`services.monitor.observe` makes of each input."""

    def __init__(self) -> None:
        # the monitor's own registry (not the client's global one)
        self.registry = CollectorRegistry()
        self.instruments = Instruments(self.registry)
        self.watch = ob.JobWatch()

    def start(self, ctx: ServiceContext, fetch_s: float) -> None:
        timeline = ConsumerSpec(subjects.STREAM_TIMELINE.name, TIMELINE_DURABLE,
                                subjects.TIMELINE_ALL, fetch_timeout=fetch_s)
        ctx.spawn(consume(ctx.js, timeline, decode_timeline, self._on_timeline, ctx.reporter,
                          ctx.stopping), "timeline")
        ctx.spawn(watch_bucket(ctx, subjects.KV_EXPLAIN, self._on_explain, asyncio.Event()),
                  "watch-explain")

    def on_job_event(self, event: JobEvent, record: JobRecord | None) -> None:
        self.instruments.apply(self.watch.on_job_event(event, record))

    def on_plan(self, event: PlanIssued) -> None:
        self.instruments.apply(ob.on_plan(event))

    def on_error(self, record: ErrorRecord) -> None:
        self.instruments.apply(ob.on_error(record))

    async def _on_timeline(self, entry: TimelineEntry, delivery: Delivery) -> None:
        self.instruments.apply(ob.on_timeline(entry))

    def _on_explain(self, entry: KeyValue.Entry) -> None:
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            return
        with contextlib.suppress(msgspec.DecodeError):  # the gateway reports bad ones
            explain = _EXPLAIN.decode(entry.value)
            if explain.forecast is not None:
                self.watch.on_forecast(JobId(entry.key), explain.forecast.start)
