"""The planner's :class:`~shared.snapshot.Snapshot` from the jobs and what they
hold: the rules the live leader (:mod:`scheduling.live.snapshot`) and the
simulator (:mod:`simulator.engine`) share.

Each caller turns its own records into a :class:`Holder` per job (the state
the planner would see, and the configuration the job holds or is about to
hold) and names what no job it shows holds; :func:`assemble` applies, once:

- **who is shown**: every job, but a CPU job under a policy that does not
  plan cores (never: it has no GPU type and such a policy would stop it) and,
  in a first plan, a running GPU job without an estimate (it cannot be
  planned; in a later plan it keeps its GPUs anyway, §3.6);
- **sticky**: a job hidden in a first plan while it runs keeps where it is;
  the caller adds it to the plan it publishes;
- **held**: the GPUs of every configuration a job holds, but that of a
  running job shown in a first plan (every running job is replanned at the
  start of a round, §3.6), plus ``pinned`` (placements of jobs the planner
  does not see: ended, unknown) and ``pinned_gpus`` (profiling runs that no
  holder's configuration names);
- **held_extras**: the cores and memory (``Configuration.extras``) of the
  same configurations;
- **profiling_held**: the GPUs of the profiling runs (§3.2), given apart
  (each is held through a holder, ``pinned`` or ``pinned_gpus`` as well);
- per server of the cluster, no more than the server has; servers holding
  nothing are left out;
- **estimates**: those of the shown jobs that are not profiling.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import JobId, ServerId
from shared.resources import NOTHING, Resources
from shared.snapshot import JobState, Snapshot


class Holder(NamedTuple):
    """A job as the planner would see it, and the configuration it holds or
    is about to hold (None: nothing)."""

    state: JobState
    holds: Configuration | None = None


class Assembled(NamedTuple):
    snapshot: Snapshot
    # Jobs hidden in a first plan while running: kept where they are.
    sticky: dict[JobId, Configuration]


def hidden(state: JobState, first_plan: bool, estimated: bool, plans_cores: bool) -> bool:
    """Whether the planner does not see the job (see the module docstring)."""
    if state.spec.kind == "cpu":
        return not plans_cores
    return first_plan and state.phase == "running" and not estimated


def assemble(
    now: float,
    cluster: Cluster,
    holders: Iterable[Holder],
    estimates: Mapping[JobId, JobEstimate],
    *,
    first_plan: bool,
    plans_cores: bool = True,
    pinned: Iterable[Configuration] = (),
    pinned_gpus: Mapping[ServerId, int] | None = None,
    profiling: Mapping[ServerId, int] | None = None,
    layer_state: Mapping[str, bytes] | None = None,
    bandwidth_gbps: Mapping[ServerId, float] | None = None,
) -> Assembled:
    """The snapshot of ``holders`` on ``cluster`` (see the module docstring);
    ``plans_cores``: whether the policy plans CPU jobs."""
    jobs: list[JobState] = []
    held: list[Configuration] = list(pinned)
    sticky: dict[JobId, Configuration] = {}
    for state, holds in holders:
        running = state.phase == "running"
        if hidden(state, first_plan, state.spec.id in estimates, plans_cores):
            if first_plan and running and holds is not None:
                sticky[state.spec.id] = holds
        else:
            jobs.append(state)
            if first_plan and running:
                continue  # the plan's to give
        if holds is not None:
            held.append(holds)
    gpus: Counter[ServerId] = Counter(pinned_gpus or {})
    for config in held:
        gpus.update(config.as_dict())
    planned = {j.spec.id for j in jobs if j.phase != "profiling"}
    snapshot = Snapshot(
        now=now,
        cluster=cluster,
        jobs=tuple(jobs),
        estimates={k: v for k, v in estimates.items() if k in planned},
        held=_capped(cluster, gpus),
        first_plan=first_plan,
        profiling_held=_capped(cluster, profiling or {}),
        held_extras=_extras(cluster, held),
        layer_state=dict(layer_state or {}),
        bandwidth_gbps=dict(bandwidth_gbps or {}),
    )
    return Assembled(snapshot, sticky)


def _capped(cluster: Cluster, gpus: Mapping[ServerId, int]) -> dict[ServerId, int]:
    """``gpus`` on the cluster's servers that hold any, no more than each has."""
    return {s.id: min(s.gpus, gpus[s.id]) for s in cluster.servers if gpus.get(s.id, 0) > 0}


def _extras(cluster: Cluster, configs: Sequence[Configuration]) -> dict[ServerId, Resources]:
    """The cores and memory ``configs`` hold, on the cluster's servers that hold any."""
    extras: dict[ServerId, Resources] = {}
    for config in configs:
        if not config.extras:
            continue  # GPUs only
        for sid, extra in zip(config.servers, config.extras, strict=True):
            if not extra.is_zero:
                extras[sid] = extras.get(sid, NOTHING) + extra
    return {s.id: extras[s.id] for s in cluster.servers if s.id in extras}
