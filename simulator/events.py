"""The simulator's events: a tagged union, as the live system's (shared/events.py).

The engine's clock moves to the earliest pending event and dispatches every
event due then with one exhaustive ``match`` (``simulator.engine``); a kind
added here without a handler fails the type check. At one time the events
apply in a fixed order, which the results depend on: jobs finishing,
profiling runs ending, arrivals, then the round's first plan (§3.6) or else a
plan later in the round.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from shared.ids import JobId, ServerId
from shared.measurements import ProfileReport


class SimEvent(msgspec.Struct, frozen=True, tag_field="kind"):
    """Base of every simulator event: when it happens (virtual seconds).

    ``at`` is positional and has no default on purpose: msgspec puts
    keyword-only and defaulted fields last, and :class:`ProfileEnd`'s order
    must compare ``at`` first.
    """

    at: float


class Completion(SimEvent, frozen=True, tag="completion"):
    """A running job reaches its total samples at its current rate."""

    job_id: JobId


class ProfileEnd(SimEvent, frozen=True, order=True, tag="profile_end"):
    """A profiling run ends and reports (§3.2). Ordered by ``at`` (then job
    and server): the engine keeps the runs in flight in a heap of these."""

    job_id: JobId
    server: ServerId
    report: ProfileReport


class Arrival(SimEvent, frozen=True, tag="arrival"):
    """A job of the workload is submitted."""

    job_id: JobId


class RoundStart(SimEvent, frozen=True, tag="round_start"):
    """A round boundary: the first plan of the round (§3.6)."""


class FillPlan(SimEvent, frozen=True, tag="fill_plan"):
    """A plan later in the round, for the GPUs released and the jobs arrived
    since the last plan (§3.6)."""


Event: TypeAlias = Completion | ProfileEnd | Arrival | RoundStart | FillPlan
