"""What the monitor counts itself for its metrics, and one scrape.

The buckets (``hops_nodes``, ``hops_alloc``, ``hops_jobs``) are read at each
scrape (:mod:`services.monitor.scrape`); what no bucket holds is counted
here as it comes: error records per service (``hops_errors_total``),
refusals per service and code (``hops_refused_total``, the codes of
:data:`services.monitor.metrics.REFUSAL_CODES`) and plan entries the placer
skipped as overtaken by events, per reason (``hops.v1.placer.skipped``),
apart from errors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from services.monitor.metrics import (
    REFUSAL_CODES,
    LatencyBook,
    refused_family,
    render,
    skipped_family,
    state_metrics,
)
from services.monitor.scrape import read_state
from shared.events import WireError, decode_error_record, decode_plan_entry_skipped


class Counts:
    """Error records, refusals and skipped plan entries, as they come."""

    def __init__(self) -> None:
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
        if record.code in REFUSAL_CODES:
            self.refused[(record.service, record.code)] += 1

    async def on_skipped(self, msg: Msg) -> None:
        self.skipped[decode_plan_entry_skipped(msg.data).reason] += 1

    async def scrape(self, js: JetStreamContext, book: LatencyBook, now: float,
                     window_h: float,
                     bad_record: Callable[[str, str, bytes], Awaitable[None]]) -> str:
        """One scrape: the buckets read now, as the API reads them, and the counts."""
        state = await read_state(js, bad_record)
        families = state_metrics(state, book, self.errors, now, window_h)
        return render([*families, refused_family(self.refused), skipped_family(self.skipped)])
