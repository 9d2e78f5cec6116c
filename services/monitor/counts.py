"""What the monitor counts itself for its metrics, and one scrape.

The buckets (``hops_nodes``, ``hops_alloc``, ``hops_jobs``) are read at each
scrape (:mod:`services.monitor.scrape`); what no bucket holds is counted
here as it comes: error records per service (``hops_errors_total``),
refusals per service and code (``hops_refused_total``, the codes of
:data:`services.monitor.metrics.REFUSAL_CODES`) and plan entries the placer
skipped as overtaken by events, per reason (``hops.v1.placer.skipped``),
apart from errors. Each error record also goes to ``on_record`` (the
refusals by code of :mod:`services.monitor.observe`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client.metrics_core import Metric

from services.monitor.metrics import (
    REFUSAL_CODES,
    LatencyBook,
    refused_family,
    skipped_family,
    state_metrics,
    to_prometheus,
)
from services.monitor.scrape import read_state
from shared.events import (
    ErrorRecord,
    WireError,
    decode_error_record,
    decode_plan_entry_skipped,
)


class Counts:
    """Error records, refusals and skipped plan entries, as they come."""

    def __init__(self, on_record: Callable[[ErrorRecord], None] = lambda _: None) -> None:
        self.on_record = on_record
        self.errors: Counter[str] = Counter()
        self.refused: Counter[tuple[str, str]] = Counter()  # (service, code)
        self.skipped: Counter[str] = Counter()  # plan entries the placer skipped, by reason

    async def on_error_record(self, msg: Msg) -> None:
        try:
            record = decode_error_record(msg.data)
        except WireError:  # no error record about an error record: count it, go on
            self.errors["unreadable"] += 1
            return
        self.errors[record.service] += 1
        self.on_record(record)
        if record.code in REFUSAL_CODES:
            self.refused[(record.service, record.code)] += 1

    async def on_skipped(self, msg: Msg) -> None:
        self.skipped[decode_plan_entry_skipped(msg.data).reason] += 1

    async def scrape(self, js: JetStreamContext, book: LatencyBook, now: float,
                     window_h: float,
                     bad_record: Callable[[str, str, bytes], Awaitable[None]]) -> list[Metric]:
        """One scrape: the buckets read now, as the API reads them, and the counts."""
        state = await read_state(js, bad_record)
        families = state_metrics(state, book, self.errors, now, window_h)
        return to_prometheus([*families, refused_family(self.refused),
                              skipped_family(self.skipped)])
