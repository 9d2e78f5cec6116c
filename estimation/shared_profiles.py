"""The theoretical layer shared by the jobs of one profile signature.

A departure from Hops §3.3 (one database object per job): besides each
job's own records, the database keeps, per (signature, GPU type), the last
profile any job of the signature reported there (:mod:`shared.reuse`). A
job of the signature that was not profiled on the type is estimated from
that profile: its own record on the type is seeded with the profile's time
modules and profiled data/wait samples the first time it is read, and its
running-mode samples then correct it (§3.5) as they do a profiled job's.

A shared profile is *stale* when a job measured a throughput that
disagrees with it (:func:`shared.reuse.disagrees`) or an operator asked for
it to be profiled again; a stale profile is not offered to new jobs
(:meth:`SharedProfiles.types`), so the signature's next job is profiled on
the type, and its report makes the profile current again. Jobs already
seeded keep their own records.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from shared.ids import GpuType
from shared.measurements import ProfileReport
from shared.reuse import Signature


class SharedState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One shared profile as :class:`~estimation.database.DatabaseState` keeps it."""

    signature: str
    report: ProfileReport
    stale: bool = False


@dataclass(slots=True)
class SharedProfile:
    report: ProfileReport
    stale: bool = False


class SharedProfiles:
    """The shared profiles of every (signature, GPU type), in arrival order."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[Signature, GpuType], SharedProfile] = {}

    def record(self, report: ProfileReport) -> None:
        """Keep ``report`` as its signature's profile on its type (current
        again if it was stale); a report without a signature is not shared."""
        if report.signature:
            key = (Signature(report.signature), report.gpu_type)
            self._by_key[key] = SharedProfile(report)

    def get(self, signature: Signature | None, gpu_type: GpuType) -> ProfileReport | None:
        """The signature's profile on ``gpu_type``, stale or not."""
        found = self._by_key.get((signature, gpu_type)) if signature else None
        return None if found is None else found.report

    def types(self, signature: Signature | None) -> frozenset[GpuType]:
        """The types the signature holds a current (not stale) profile of."""
        if not signature:
            return frozenset()
        return frozenset(t for (s, t), p in self._by_key.items() if s == signature and not p.stale)

    def mark_stale(self, signature: Signature, gpu_types: frozenset[GpuType] | None = None
                   ) -> tuple[GpuType, ...]:
        """Mark the signature's profiles on ``gpu_types`` (None: every type)
        stale; returns the types that were current and are now stale."""
        marked = []
        for (s, t), profile in sorted(self._by_key.items()):
            if s == signature and (gpu_types is None or t in gpu_types) and not profile.stale:
                profile.stale = True
                marked.append(t)
        return tuple(marked)

    def listing(self) -> dict[Signature, dict[GpuType, bool]]:
        """Every signature's types, each with whether its profile is stale."""
        out: dict[Signature, dict[GpuType, bool]] = {}
        for (s, t), profile in sorted(self._by_key.items()):
            out.setdefault(s, {})[t] = profile.stale
        return out

    def to_state(self) -> tuple[SharedState, ...]:
        items = sorted(self._by_key.items())
        return tuple(SharedState(s, p.report, p.stale) for (s, _), p in items)

    @classmethod
    def from_state(cls, states: tuple[SharedState, ...]) -> SharedProfiles:
        shared = cls()
        for st in states:
            key = (Signature(st.signature), st.report.gpu_type)
            shared._by_key[key] = SharedProfile(st.report, st.stale)
        return shared
