"""Does a plan fit? The check a layer or the simulator runs on a plan.

Every policy plans GPUs only, and a layer may attach CPU cores or memory to
the configurations the policy chose (``Configuration.extras``): nothing in
the policy then guarantees that a server has the cores for all it was given.
:func:`plan_overallocation` books the plan on a
:class:`~shared.resources.Ledger` of the servers on which what the
snapshot holds is booked already (``held``, ``held_extras``), so the
first over-allocation is named (server and resource) before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.resources import NOTHING, Ledger, OverAllocation, Resources
from shared.snapshot import Assignment, Plan, ProfilingTask, Snapshot


def plan_overallocation(snapshot: Snapshot, plan: Plan) -> str | None:
    """Why ``plan`` does not fit in what ``snapshot`` leaves free (the first
    job or profiling run that does not, and the server and resource short),
    or None when it fits in every resource of every server.

    In a plan later in the round a running job assigned the configuration it
    holds keeps it: it is in ``held`` already and books nothing again; one
    assigned the same GPUs with other cores (an in-place change) gives back
    what it held and books its new configuration."""
    keeps = {} if snapshot.first_plan else {
        j.id: j.current for j in snapshot.jobs if j.phase == "running"
    }
    snapshot = _released(snapshot, keeps, plan)
    runs = [a for a in plan.assignments if keeps.get(a.job_id) != a.config]
    capacity = snapshot.cluster.capacity()
    if _fits(capacity, snapshot, runs, plan.profiling):
        return None
    ledger = Ledger(capacity)
    ledger.book("held", _held(snapshot, capacity))
    bookings = [(f"job {a.job_id}", a.config.demands()) for a in runs]
    bookings += [
        (f"profiling {t.job_id} on {t.server}", {t.server: Resources(gpus=t.gpus)})
        for t in plan.profiling
    ]
    seen: set[str] = set()
    for holder, demands in bookings:
        if holder in seen:
            return f"{holder} is planned twice"
        seen.add(holder)
        try:
            ledger.book(holder, demands)
        except OverAllocation as e:
            return str(e)
    return None


def _fits(
    capacity: Mapping[ServerId, Resources],
    snapshot: Snapshot,
    runs: Sequence[Assignment],
    profiling: Sequence[ProfilingTask],
) -> bool:
    """Whether the plan fits, from per-server sums of plain integers: the
    check runs on every plan of the simulator, and a plan that fits (all of
    them but a faulty layer's) is told so without a booking. Bookings only
    add, so the sums fit exactly when every booking in turn would; when they
    do not, the ledger replays the plan to name the first that does not."""
    if len({a.job_id for a in runs}) < len(runs) or (
        len({(t.job_id, t.server) for t in profiling}) < len(profiling)
    ):
        return False
    # What the snapshot holds, no more than a server has (free_resources).
    sums = {sid: [min(g, capacity[sid].gpus), 0, 0]
            for sid, g in snapshot.held.items() if sid in capacity}
    for sid, extra in snapshot.held_extras.items():
        if sid in capacity:
            row = sums.setdefault(sid, [0, 0, 0])
            row[1] = min(extra.cores, capacity[sid].cores)
            row[2] = min(extra.memory_mb, capacity[sid].memory_mb)
    for a in runs:
        config = a.config
        extras = config.extras or ((NOTHING,) * len(config.parts))
        for (sid, gpus), extra in zip(config.parts, extras, strict=True):
            row = sums.setdefault(sid, [0, 0, 0])
            row[0] += gpus
            row[1] += extra.cores
            row[2] += extra.memory_mb
    for t in profiling:
        sums.setdefault(t.server, [0, 0, 0])[0] += t.gpus
    for sid, (gpus, cores, memory_mb) in sums.items():
        cap = capacity.get(sid)
        if cap is None or gpus > cap.gpus or cores > cap.cores or memory_mb > cap.memory_mb:
            return False
    return True


def _released(snapshot: Snapshot, keeps: Mapping[JobId, Configuration | None],
              plan: Plan) -> Snapshot:
    """``snapshot`` without what the running jobs changed in place hold."""
    changed = [keeps[a.job_id] for a in plan.assignments
               if (cur := keeps.get(a.job_id)) is not None and cur != a.config
               and cur.parts == a.config.parts]
    if not changed:
        return snapshot
    held = dict(snapshot.held)
    extras = dict(snapshot.held_extras)
    for config in changed:
        assert config is not None
        for sid, want in config.demands().items():
            held[sid] = max(0, held.get(sid, 0) - want.gpus)
            extras[sid] = extras.get(sid, NOTHING).minus(
                Resources(cores=want.cores, memory_mb=want.memory_mb))
    return msgspec.structs.replace(snapshot, held=held, held_extras=extras)


def _held(snapshot: Snapshot, capacity: Mapping[ServerId, Resources]) -> dict[ServerId, Resources]:
    """What the snapshot holds outside the plan on each server (GPUs and
    extras), no more than the server has: capacity less
    :meth:`~shared.snapshot.Snapshot.free_resources`, on the servers that
    hold anything."""
    out: dict[ServerId, Resources] = {}
    for sid in snapshot.held.keys() | snapshot.held_extras.keys():
        cap = capacity.get(sid)
        if cap is not None:
            extra = snapshot.held_extras.get(sid, NOTHING)
            out[sid] = Resources(min(cap.gpus, snapshot.held.get(sid, 0)),
                                 min(cap.cores, extra.cores),
                                 min(cap.memory_mb, extra.memory_mb))
    return out
