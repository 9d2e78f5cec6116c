"""The scheduler's leader lease, a pure state machine over KV ``hops_leader``.

Every scheduler replica answers admission requests, but only one, the
leader, plans (§3.6) and writes job records. Leadership is one key,
:data:`LEASE_KEY`, in a bucket whose entries expire ``ttl`` seconds after
their last write (the bucket's max age, ``HOPS_LEADER_TTL``):

- a follower reads the key every ``ttl / 3`` seconds; when it is absent
  (expired, or deleted by a leader that stepped down) it *creates* it, which
  JetStream allows to exactly one replica;
- the leader rewrites the key every ``ttl / 3`` seconds with optimistic
  concurrency (the revision it last wrote): a failed write means that the key
  expired or someone else holds it, and the leader steps down at once;
- a leader that cannot write for ``ttl - ttl / 3`` seconds (say, cut off
  from NATS) stops acting as leader by itself, before the key expires on the
  server and a standby takes over.

The *term* of a leadership is the revision of the create that began it. KV
revisions are the bucket stream's sequence numbers, which only grow, even
when entries expire, so every takeover has a larger term than the last;
plans carry it and the placer ignores plans of an older term.

On a NATS cluster (docs/live.md, *A NATS cluster*) the lease bucket's own
JetStream leader may die; the survivors elect another within
:data:`ELECTION_STALL_S`, and every write waits meanwhile. A lease built with
``stall`` rides that out: it refreshes every ``(ttl - stall) / 3`` seconds,
so that a refresh that stalls ``stall`` seconds still lands before
:attr:`Lease.horizon`, and a write that failed without a conflict (a
timeout, no responders) does not depose the leader: only the horizon does.
:func:`lease_ttl` is the TTL that leaves room for that. A conflict (someone
else's revision) deposes at once, as without a cluster.

The shell performs the reads and writes this module asks for and reports
back; nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from typing import Literal

import msgspec

LEASE_KEY = "scheduler"
# The longest a JetStream leader election stalled writes to a stream after
# kill -9 of its leader, rounded up (4.2-8.0 s; bench/nats_election.py).
ELECTION_STALL_S = 8.0
# The shortest refresh interval worth having: three refreshes within a TTL.
_MIN_INTERVAL_S = 1.5


def lease_ttl(ttl: float, replicated: bool) -> float:
    """The lease's TTL for a configured ``ttl``: on replicated JetStream at
    least :data:`ELECTION_STALL_S` plus three refresh intervals, so that an
    election never costs the leader its lease."""
    return max(ttl, ELECTION_STALL_S + 3 * _MIN_INTERVAL_S) if replicated else ttl


def lease_stall(replicated: bool) -> float:
    """How long a write may stall: an election on replicated JetStream, else 0."""
    return ELECTION_STALL_S if replicated else 0.0

Change = Literal["elected", "deposed"] | None


class LeaseValue(msgspec.Struct, frozen=True, kw_only=True):
    """The value of the lease key: who holds it, since when, and the term
    (0 in the create that starts a term, since its revision is not known yet)."""

    holder: str
    term: int = 0
    acquired_at: float = 0.0
    refreshed_at: float = 0.0
    v: int = 1


class Observed(msgspec.Struct, frozen=True):
    """The lease key as read: its value and revision."""

    value: LeaseValue
    revision: int

    @classmethod
    def of(cls, data: bytes, revision: int) -> Observed:
        """The key's bytes as read; a value that is not a lease is held by
        nobody we know, and waits out its TTL like any other."""
        return cls(decode_value(data) or LeaseValue(holder="?"), revision)


class Create(msgspec.Struct, frozen=True):
    """Create the key with ``value`` (fails if it exists)."""

    value: LeaseValue


class Refresh(msgspec.Struct, frozen=True):
    """Rewrite the key with ``value`` if its revision is still ``revision``."""

    value: LeaseValue
    revision: int


class Wait(msgspec.Struct, frozen=True):
    """Someone else leads: do nothing until the next tick."""

    holder: str = ""


Action = Create | Refresh | Wait

_DECODER = msgspec.json.Decoder(LeaseValue)


def encode_value(value: LeaseValue) -> bytes:
    return msgspec.json.encode(value)


def decode_value(data: bytes) -> LeaseValue | None:
    """The lease value, or ``None`` for bytes that are not one (a foreign
    write; it is treated as held by nobody we know and waits out its TTL)."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError:
        return None


class Lease:
    """One replica's view of the lease; see the module docstring."""

    def __init__(self, holder: str, ttl: float, stall: float = 0.0) -> None:
        if not holder:
            raise ValueError("holder must not be empty")
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0, got {ttl}")
        if not 0 <= stall < ttl:
            raise ValueError(f"a stall of {stall} s leaves no lease in a ttl of {ttl} s")
        self.holder = holder
        self.ttl = ttl
        self.stall = stall
        self.role: Literal["follower", "leader"] = "follower"
        self.term = 0
        self.revision = 0
        self.acquired_at = 0.0
        self.last_ok = 0.0
        self.seen_holder = ""

    @property
    def interval(self) -> float:
        """Seconds between two ticks (reads or refreshes)."""
        return (self.ttl - self.stall) / 3.0

    @property
    def horizon(self) -> float:
        """How long after its last successful write a leader still acts as one."""
        return self.ttl - self.interval

    def is_leader(self, now: float) -> bool:
        return self.role == "leader" and now - self.last_ok < self.horizon

    def action(self, now: float, observed: Observed | None) -> Action:
        """What to do at this tick; ``observed`` is the key as read (only
        needed by a follower; ``None`` when absent or deleted)."""
        if self.role == "leader":
            value = LeaseValue(
                holder=self.holder, term=self.term, acquired_at=self.acquired_at, refreshed_at=now
            )
            return Refresh(value, self.revision)
        if observed is None:
            return Create(LeaseValue(holder=self.holder, acquired_at=now, refreshed_at=now))
        self.seen_holder = observed.value.holder
        return Wait(observed.value.holder)

    def written(self, action: Create | Refresh, revision: int, now: float) -> Change:
        """The write of ``action`` succeeded with ``revision``."""
        self.revision = revision
        self.last_ok = now
        if isinstance(action, Create):
            self.role, self.term, self.acquired_at = "leader", revision, now
            self.seen_holder = self.holder
            return "elected"
        return None

    def failed(self, conflict: bool = True) -> Change:
        """A write failed: on a conflict (or any failure, without a ``stall``
        to ride out) not leader any more; otherwise the horizon decides."""
        if conflict or not self.stall:
            return self._step_down()
        return None

    def write_budget(self, now: float) -> float:
        """How long a leader's refresh may keep trying: until the horizon."""
        return max(0.0, self.last_ok + self.horizon - now)

    def check(self, now: float) -> Change:
        """Step down when the last successful write is older than :attr:`horizon`."""
        if self.role == "leader" and not self.is_leader(now):
            return self._step_down()
        return None

    def release(self) -> int | None:
        """Stepping down on purpose (shutdown): the revision to delete, if leader."""
        if self.role != "leader":
            return None
        revision = self.revision
        self._step_down()
        return revision

    def _step_down(self) -> Change:
        if self.role != "leader":
            return None
        self.role = "follower"
        self.seen_holder = ""
        return "deposed"
