"""An ensure of the JetStream layout never weakens what exists (docs/live.md,
*A NATS cluster*).

Every service ensures the layout at start, with the replicas and limits of
its own settings. A service started with ``HOPS_NATS_REPLICAS`` unset (R1)
against streams made at R3 would otherwise take two copies of every job's
record away; a smaller size limit would drop old records. As with an apply
in Kubernetes, a configured value below what a stream has is not applied:
:func:`never_weaker` keeps the existing (stronger) value and says which.
"""

from __future__ import annotations

import dataclasses
import math

from nats.js.api import StreamConfig

# The limits whose lowering loses copies or data: replicas, and how much,
# how long and how large a stream keeps. Unset, 0 or -1 means no limit.
DURABLE = ("num_replicas", "max_bytes", "max_age", "max_msgs", "max_msgs_per_subject",
           "max_msg_size")


def _strength(field: str, value: float | None) -> float:
    if field == "num_replicas":
        return float(value or 1)
    return math.inf if value is None or value <= 0 else float(value)


def never_weaker(existing: StreamConfig, wanted: StreamConfig,
                 limits: tuple[str, ...] = DURABLE) -> tuple[StreamConfig, list[str]]:
    """``wanted`` with each of ``limits`` raised back to ``existing``'s where
    ``wanted`` is lower, and one note for each limit kept so. (A bucket whose
    TTL is a lease's, ``hops_leader``, leaves ``max_age`` out: it follows
    ``HOPS_LEADER_TTL`` either way.)"""
    kept: dict[str, object] = {}
    notes: list[str] = []
    for field in limits:
        have, want = getattr(existing, field), getattr(wanted, field)
        if _strength(field, want) < _strength(field, have):
            kept[field] = have
            notes.append(f"{field} {_shown(have)} kept (configured {_shown(want)})")
    return dataclasses.replace(wanted, **kept), notes  # type: ignore[arg-type]


def _shown(value: float | None) -> str:
    if value is None or value <= 0:
        return "unlimited"
    return f"{value:g}" if isinstance(value, float) else str(value)
