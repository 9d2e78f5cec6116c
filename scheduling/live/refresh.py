"""What the leader changes in job records before each plan (pure): the
steps of :meth:`services.scheduler.planning.Planning._refresh_records`.

For every job, in this order: back to profiling for GPU types it lacks
that are no longer busy, queued once its profiles cover the alive types
(but those every GPU of which runs a job, :func:`scheduling.profiling.
busy_types`), held while it fits no alive server or the policy (or
released when it fits again, :func:`scheduling.live.admission.
hold_problem`), a running job's record with the cores its placement holds
after an in-place change (:func:`scheduling.live.state.retune`) and with
its heartbeats' progress (:mod:`scheduling.live.state`). Each step is applied to the record the
previous one left, and is ``None`` where it changes nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

from scheduling.live import admission as adm
from scheduling.live import state as st
from scheduling.live import tenancy as tn
from scheduling.live.snapshot import profiling_step
from scheduling.live.state import LiveJobRecord
from shared.configuration import Configuration
from shared.ids import GpuType
from shared.records import NodeRecord
from shared.tenants import TenantsFile

Step = Callable[[LiveJobRecord], LiveJobRecord | None]


class Cluster(NamedTuple):
    """What every job's steps read of the cluster and the policy."""

    alive: Sequence[NodeRecord]
    required: frozenset[GpuType]  # the alive types less those given up for the job
    busy: frozenset[GpuType]
    r_num: int
    schedules_cores: bool
    tenants: TenantsFile | None = None  # the tenants file now (None: no check)


class InFlight(NamedTuple):
    """What the leader has in flight for one job."""

    profiling: bool  # a profiling run issued or booked
    starting: bool  # a start issued or booked
    progress: float | None  # the largest progress its heartbeats reported
    booked: Configuration | None = None  # its run placement in hops_alloc


def steps(rec: LiveJobRecord, cluster: Cluster, flight: InFlight, now: float) -> list[Step]:
    """The changes to apply to ``rec``, in order (see the module docstring)."""
    back, need = profiling_step(rec, cluster.required, cluster.busy, flight.profiling,
                                flight.starting)
    problem = adm.hold_problem(rec.spec, cluster.alive, cluster.r_num, cluster.schedules_cores)
    stranded = tn.stranded_problem(cluster.tenants, rec.spec.tenant)
    # a job of an unknown tenant waits under that reason alone
    unfit: list[Step] = ([functools.partial(st.hold, problem=problem)]
                         if stranded is None else [])
    out: list[Step] = [
        functools.partial(st.back_to_profiling, types=back, now=now),
        functools.partial(st.promote, required=need, now=now),
        *unfit,
        functools.partial(st.hold_tenant, problem=stranded),
        functools.partial(st.retune, config=flight.booked),
    ]
    if flight.progress is not None:
        out.append(functools.partial(st.with_progress, progress=flight.progress))
    return out
