"""Which plans the placer applies: only the current leader's, in stream order.

A plan is applied when its ``term`` is the term of the scheduler lease as
it is now in KV ``hops_leader`` (:mod:`scheduling.live.lease`),
read for each plan. The placer keeps no "highest term seen": a term it
remembered would let one plan with a term no leader ever held (forged, or
written by a broken client) make every real plan look old until a
restart. Reading the lease instead, such a plan is refused and the next
plan of the real leader is applied.

What is refused, and how loudly:

* no lease (between two leaders) or an older term (a deposed leader's plan,
  still in flight during a failover): logged; the new leader plans at once
  on election, so nothing is lost;
* a newer term than the lease's: no leader holds it, so the plan is not
  the scheduler's; logged and reported as an ``error_record`` (``invalid``);
* a plan not later on the stream than one applied already (a redelivery
  after a crash would undo newer plans): logged;
* a plan the same leader has already replaced by a first plan later on the
  stream (:meth:`PlanGate.superseded`): a first plan replans every job, so
  applying the older one first would only start jobs the newer one may stop
  a moment later (seen under a burst: a fill plan's starts stopped by the
  next round's first plan within 0.1 s). Logged at info: it is no error.
"""

from __future__ import annotations

from dataclasses import dataclass

import nats.js.errors
from nats.js.kv import KeyValue

from scheduling.live.lease import LEASE_KEY, decode_value
from shared.wire import INVALID


@dataclass(frozen=True)
class Refusal:
    """Why a plan is skipped; ``code`` is set when it deserves an error record."""

    why: str
    code: str = ""


@dataclass
class PlanGate:
    """See the module docstring; :meth:`refuse` is pure."""

    applied_seq: int = 0

    def refuse(self, term: int, lease_term: int | None, seq: int) -> Refusal | None:
        """Why the plan of ``term`` at stream sequence ``seq`` is skipped
        while the lease's term is ``lease_term`` (None: no lease), or None."""
        if lease_term is None:
            return Refusal(f"term {term}: no scheduler holds the leader lease")
        if term < lease_term:
            return Refusal(f"term {term} is older than the leader's term {lease_term}")
        if term > lease_term:
            return Refusal(f"term {term} is not the leader's term {lease_term}: no leader "
                           "has held it (not a plan of the scheduler)", INVALID)
        if seq <= self.applied_seq:
            return Refusal(f"plan {seq} is not newer than the applied plan {self.applied_seq}")
        return None

    @staticmethod
    def superseded(term: int, seq: int, newest: tuple[int, int, bool] | None) -> Refusal | None:
        """Why the plan of ``term`` at ``seq`` is skipped given the newest plan
        on the stream (``(seq, term, first_plan)``, None: unknown), or None."""
        if newest is None:
            return None
        newest_seq, newest_term, first = newest
        if newest_seq > seq and newest_term == term and first:
            return Refusal(f"plan {seq} is superseded by the first plan {newest_seq}")
        return None

    def applied(self, seq: int) -> None:
        self.applied_seq = max(self.applied_seq, seq)


async def leader_term(kv: KeyValue) -> int | None:
    """The term of the lease in ``kv`` (bucket ``hops_leader``) now; None when
    no one holds it. A value written by the create that began a term says
    term 0 (its revision was not known yet), and that revision is the term."""
    try:
        entry = await kv.get(LEASE_KEY)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):  # none, expired
        return None
    value = decode_value(entry.value or b"")
    if value is None:
        return None
    return value.term or entry.revision
