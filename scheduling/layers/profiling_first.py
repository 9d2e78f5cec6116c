"""Profiling-first as a layer (Hops §3.2): the profiling queue takes GPUs
before the policy beneath it plans, whatever that policy is.

Hops, Sia and Gavel each called :func:`~scheduling.profiling.profile_first`
themselves; the registry now wraps every policy in :class:`ProfilingFirst`
instead, so that the three share one definition. The policy beneath sees the
profiling runs' GPUs as held (and as ``profiling_held``, since they are
profiling runs), exactly the free GPUs the policies computed for themselves
before; its plan gets the profiling tasks in front of its own.

The knobs (:class:`ProfilingSettings`) are the same for every policy today,
with the defaults of :mod:`scheduling.profiling`; a policy's spec
carries them as ``profile_gpus``, ``profile_share`` and ``profile_preempt``
(:func:`scheduling.registry.make_policy`).
"""

from __future__ import annotations

from collections import Counter

import msgspec

from scheduling.layers.base import annotate, hold
from scheduling.policy import Policy
from scheduling.profiling import PROFILE_PREEMPT, PROFILE_SHARE, profile_first
from shared.ids import ServerId
from shared.snapshot import JobState, LayerRecord, Plan, ProfilingTask, Snapshot


class ProfilingSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """GPUs per profiling run, the share of each GPU type profiling runs may
    hold at once, and whether a first plan's profiling may take a running
    job's GPU (the paper's profiling-first; see :mod:`.profiling`)."""

    gpus: int = 1
    share: float = PROFILE_SHARE
    preempt: bool = PROFILE_PREEMPT


class ProfilingFirst:
    """The profiling queue served before the inner policy (Hops §3.2)."""

    name = "profiling-first"

    def __init__(self, settings: ProfilingSettings | None = None) -> None:
        self.settings = settings or ProfilingSettings()

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        s = self.settings
        tasks, _ = profile_first(snapshot, s.gpus, s.share, s.preempt)
        taken: Counter[ServerId] = Counter()
        for t in tasks:
            taken[t.server] += t.gpus
        view = hold(snapshot, taken)
        running = Counter(snapshot.profiling_held)
        running.update(taken)
        view = msgspec.structs.replace(view, profiling_held=dict(running),
                                       jobs=_tasked(view.jobs, tasks))
        plan = inner.plan(view)
        plan = msgspec.structs.replace(plan, profiling=(*tasks, *plan.profiling))
        note = f"{len(tasks)} profiling task(s)"
        return annotate(plan, LayerRecord(self.name, held=dict(taken), note=note))


def _tasked(jobs: tuple[JobState, ...], tasks: list[ProfilingTask]) -> tuple[JobState, ...]:
    """The jobs as the policy beneath sees them: a type this plan profiles is
    no longer ``unprofiled`` (as for a run already going on), so a layer
    beneath (HiveD's keeping a GPU for a guaranteed job's profiling) does
    not ask for it again."""
    taken = {(t.job_id, t.gpu_type) for t in tasks}
    if not taken:
        return jobs
    out = []
    for j in jobs:
        left = tuple(u for u in j.unprofiled if (j.id, u) not in taken)
        out.append(j if len(left) == len(j.unprofiled)
                   else msgspec.structs.replace(j, unprofiled=left))
    return tuple(out)
