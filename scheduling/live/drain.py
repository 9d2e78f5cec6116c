"""Drained nodes in the leader's snapshot (Slurm's ``state=drain``,
Kubernetes' cordon): what a plan may not use on them.

A drained node stays in the cluster (its running jobs run on an alive
server, and are planned as such), but it gets no new work: every GPU of it
that no running job holds is added to the snapshot's ``held``, so no plan
starts a job or a profiling run there. A node drained with ``move`` has all
its GPUs held: in the next first plan (the start of a round, §3.6, where
running jobs are replanned) its running jobs cannot stay, so the policy
stops them with a checkpoint and places them elsewhere, keeping their
progress (or, with no room elsewhere, they wait like any preempted job).

The held GPUs are counted per server and capped at what the server has by
:func:`scheduling.assemble.assemble`; holding a GPU twice (a job's and the
drain's) is harmless.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from scheduling.assemble import Holder
from shared.ids import ServerId
from shared.records import NodeRecord


def drain_held(nodes: Iterable[NodeRecord], holders: Iterable[Holder]) -> Counter[ServerId]:
    """The GPUs of the alive drained ``nodes`` that a plan may not use: a
    node drained with ``move`` all of its GPUs, any other what the running
    ``holders`` do not hold there."""
    drained = {n.server.id: n for n in nodes if n.alive and n.drained}
    if not drained:
        return Counter()
    running: Counter[ServerId] = Counter()
    for state, holds in holders:
        if state.phase == "running" and holds is not None:
            running.update({s: g for s, g in holds.parts if s in drained})
    return Counter({
        sid: n.server.gpus if n.drain_move else max(0, n.server.gpus - running[sid])
        for sid, n in drained.items()
    })


def drain_states(nodes: Iterable[NodeRecord]) -> tuple[tuple[ServerId, bool], ...]:
    """The alive drained nodes and whether each moves its jobs: a change
    calls for a plan, as a change of :func:`scheduling.live.snapshot.topology`
    does (an undrained node is available at the next plan)."""
    return tuple(sorted((n.server.id, n.drain_move) for n in nodes if n.alive and n.drained))
