"""Relaxed scale-fixed synchronisation within one job (hare.md §2.2.2-2.2.3).

A relaxed-sync job (``JobSpec.sync_scale`` S > 0) keeps S tasks per
training round, whatever GPUs it holds: every step processes S per-GPU
batches (its global batch, and its learning rate, are those of S GPUs). On
k ≤ S GPUs each rank processes several of those batches one after the other
as micro-batches, accumulating gradients, and the ranks synchronise once per
step. Hare's point (§2.2.2, Fig. 5-6) is that on GPUs of different speeds an
even share leaves the fast ones idle at every synchronisation; so each rank
gets a number of micro-batches proportional to its GPU's speed
(:func:`relaxed_split`), the speeds being the estimator's per-GPU
throughputs of the job on each rank's server (:func:`config_split`).

The live leader computes the split of every relaxed job a plan places
(:func:`plan_splits`, carried by ``plan_issued``), the placer passes it in
``start_job`` and the node executor sets it in the job's environment
(``HOPS_SYNC_SCALE``, ``HOPS_MICRO_BATCHES``, :mod:`shared.jobenv`) for the
in-job plugin. Ranks are numbered as the executor numbers them: the
configuration's servers in order, each server's GPUs in turn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import JobId
from shared.job import JobSpec
from shared.snapshot import Plan


def relaxed_split(sync_scale: int, speeds: Sequence[float]) -> tuple[int, ...]:
    """Micro-batches per rank: each >= 1, summing to ``sync_scale``, in
    proportion to ``speeds`` (one per rank, any unit).

    Largest remainder (Hamilton) with a floor of one: a rank whose quota is
    below one gets one and leaves the others the rest, re-apportioned among
    them; the seats the floors leave go to the largest remainders, the lower
    rank first on a tie. Exact arithmetic (fractions), so equal inputs give
    equal splits everywhere. ValueError for no ranks, more ranks than
    ``sync_scale`` (each needs a micro-batch), or a speed that is not a
    positive finite number.
    """
    k = len(speeds)
    if k == 0:
        raise ValueError("relaxed split: no ranks")
    if sync_scale < k:
        raise ValueError(f"relaxed split: {k} ranks need a sync scale of at least {k}, "
                         f"got {sync_scale}")
    for rank, speed in enumerate(speeds):
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"relaxed split: rank {rank} has speed {speed}; need > 0")
    exact = [Fraction(s) for s in speeds]
    out = [1] * k
    free = list(range(k))  # ranks not held at the floor
    while True:
        seats = sync_scale - (k - len(free))
        total = sum(exact[r] for r in free)
        quota = {r: seats * exact[r] / total for r in free}
        low = [r for r in free if quota[r] < 1]
        if not low:
            break
        free = [r for r in free if quota[r] >= 1]  # stays non-empty: quotas sum to >= 1
    floors = {r: math.floor(quota[r]) for r in free}
    left = seats - sum(floors.values())
    by_remainder = sorted(free, key=lambda r: (-(quota[r] - floors[r]), r))
    for i, r in enumerate(by_remainder):
        out[r] = floors[r] + (1 if i < left else 0)
    return tuple(out)


def even_split(sync_scale: int, ranks: int) -> tuple[int, ...]:
    """The split of equal GPUs (what a job without a speed estimate gets)."""
    return relaxed_split(sync_scale, [1.0] * ranks)


def split_problem(sync_scale: int, ranks: int, split: Sequence[int]) -> str | None:
    """Why ``split`` cannot be the micro-batches of ``ranks`` ranks of a job
    of sync scale ``sync_scale``; None when it can."""
    if sync_scale <= 0:
        return f"micro-batches {list(split)} need a sync scale > 0, got {sync_scale}"
    if len(split) != ranks:
        return f"micro-batches {list(split)} name {len(split)} ranks, the job has {ranks}"
    if any(m < 1 for m in split):
        return f"micro-batches {list(split)}: every rank needs at least one"
    if sum(split) != sync_scale:
        return f"micro-batches {list(split)} sum to {sum(split)}, not the sync scale {sync_scale}"
    return None


def format_split(split: Sequence[int]) -> str:
    """``(3, 1)`` → ``"3,1"`` (``HOPS_MICRO_BATCHES``)."""
    return ",".join(str(m) for m in split)


def parse_split(text: str) -> tuple[int, ...]:
    """``"3,1"`` → ``(3, 1)``; empty text is no split. ValueError names a bad entry."""
    text = text.strip()
    if not text:
        return ()
    out: list[int] = []
    for part in text.split(","):
        try:
            out.append(int(part.strip()))
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not an integer") from None
    return tuple(out)


def rank_speeds(est: JobEstimate, cluster: Cluster,
                config: Configuration) -> tuple[float, ...] | None:
    """The estimator's speed (samples/s) of each rank of ``config``: the
    per-GPU throughput of the job on the rank's server in this placement
    (§3.5), or alone on it where the estimator has no figure for the
    placement; None when a server's GPU type has no estimate at all."""
    nodes = config.num_nodes
    speeds: list[float] = []
    for server, gpus in config.parts:
        if server not in cluster.by_id:
            return None
        try:
            curve = est.curve(cluster, server)
        except KeyError:
            return None
        speed = est.per_gpu(cluster, server, gpus, nodes)
        if not speed > 0:
            speed = curve.agg_per_gpu(gpus)
        if not (math.isfinite(speed) and speed > 0):
            return None
        speeds.extend([speed] * gpus)
    return tuple(speeds)


def config_split(sync_scale: int, est: JobEstimate | None, cluster: Cluster,
                 config: Configuration) -> tuple[int, ...]:
    """The micro-batches of each rank of ``config`` from the estimate; empty
    when the job is not relaxed, holds more GPUs than its sync scale, or has
    no usable estimate (the executor then splits evenly)."""
    ranks = config.total_gpus
    if sync_scale <= 0 or est is None or not 0 < ranks <= sync_scale:
        return ()
    speeds = rank_speeds(est, cluster, config)
    return relaxed_split(sync_scale, speeds) if speeds is not None else ()


def plan_splits(plan: Plan, specs: Mapping[JobId, JobSpec],
                estimates: Mapping[JobId, JobEstimate],
                cluster: Cluster) -> dict[JobId, tuple[int, ...]]:
    """The split of every relaxed job ``plan`` assigns GPUs to, where the
    estimates give one (``PlanIssued.micro_batches``)."""
    out: dict[JobId, tuple[int, ...]] = {}
    for a in plan.assignments:
        spec = specs.get(a.job_id)
        if spec is None or spec.sync_scale <= 0:
            continue
        split = config_split(spec.sync_scale, estimates.get(a.job_id), cluster, a.config)
        if split:
            out[a.job_id] = split
    return out
