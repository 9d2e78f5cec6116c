"""What a scrape of ``GET /metrics`` reads: the ``hops_nodes``, ``hops_alloc``
and ``hops_jobs`` buckets, each in one pass at the moment of the scrape, as
the gateway's ``/cluster`` and ``/jobs`` read them
(:func:`services.runtime.kv.read_snapshot`).

The monitor's own copies of these buckets (its watchers, kept for its
releases) are not used for the metrics: a copy fed by a watcher is only as
fresh as the watcher, and one that stalls or falls behind would show a
cluster other than the one the API serves, with nothing to tell so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from nats.js import JetStreamContext

from services.monitor.metrics import ClusterState
from services.runtime.kv import read_snapshot
from shared import subjects
from shared.ids import JobId, ServerId
from shared.records import JobRecord, NodeRecord, Placement

T = TypeVar("T")
OnBad = Callable[[str, str, bytes], Awaitable[None]]  # (where, error, data)
BUCKETS = (subjects.KV_NODES, subjects.KV_ALLOC, subjects.KV_JOBS)


async def read_state(js: JetStreamContext, on_bad: OnBad) -> ClusterState:
    """The three buckets now; a value that does not decode is passed to
    ``on_bad`` and left out, as the gateway leaves it out."""
    revisions: dict[str, int] = {}

    async def read(bucket: str, kind: type[T]) -> dict[str, T]:
        snap = await read_snapshot(js, bucket)
        revisions[bucket] = snap.revision
        out: dict[str, T] = {}
        for key, value in snap.values.items():
            try:
                out[key] = msgspec.json.decode(value.data, type=kind)
            except msgspec.DecodeError as e:
                await on_bad(f"kv.{bucket}.{key}", str(e), value.data)
        return out

    nodes = await read(subjects.KV_NODES, NodeRecord)
    placements = await read(subjects.KV_ALLOC, Placement)
    jobs = await read(subjects.KV_JOBS, JobRecord)
    return ClusterState(
        nodes={ServerId(r.server.id): r for r in nodes.values()},
        placements={JobId(k): p for k, p in placements.items()},
        jobs={JobId(k): r for k, r in jobs.items()},
        revisions=revisions,
    )
