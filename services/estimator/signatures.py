"""The estimator's side of profile signatures (:mod:`shared.reuse`): the
listing it answers on ``hops.v1.signatures.list``, the ``profile_stale``
events it applies in stream order, and the automatic rule that publishes
one.

The automatic rule is the simulator's (:func:`shared.reuse.first_samples_disagree`):
a job estimated on a type from its signature's shared profile whose first
running samples there disagree with that estimate by more than
:data:`shared.reuse.STALE_MARGIN` makes the profile stale on the type. The
replica compares the samples with the estimate *it served* for the job
(:class:`Served`), and does not mark the profile itself: it publishes a
``profile_stale`` on ``hops.v1.signatures.stale`` and every replica, itself
included, marks it when the event comes in stream order, so replicas agree
and one restarted rebuilds the same state. Two replicas that both served the
job publish the same message id, which JetStream keeps once. While catching
up a replica has served nothing, so replaying the stream publishes nothing.

Nothing here does I/O; :mod:`services.estimator.service` is the shell.
"""

from __future__ import annotations

from estimation.database import ThroughputDatabase
from shared import events as ev
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId
from shared.measurements import ThroughputSample
from shared.reuse import Signature, first_samples_disagree, profile_signature


class Served:
    """The last estimate this replica served of each job whose signature
    holds a shared profile: what a job's first samples are compared with.
    A job leaves when it ends (:meth:`forget`)."""

    def __init__(self) -> None:
        self.by_job: dict[JobId, tuple[Signature, JobEstimate]] = {}

    def remember(self, req: ev.EstimateRequest, reply: ev.EstimateReply) -> None:
        for spec in req.jobs:
            signature = profile_signature(spec)
            est = reply.estimates.get(spec.id)
            if signature and est is not None and spec.id in reply.shared:
                self.by_job[spec.id] = (signature, est)

    def forget(self, job_id: JobId) -> None:
        self.by_job.pop(job_id, None)


def stale_of_sample(
    db: ThroughputDatabase, served: Served, sample: ThroughputSample, at: float
) -> ev.ProfileStale | None:
    """The ``profile_stale`` a running sample calls for, checked before the
    database takes it: the job's record on the sample's type was seeded from
    its signature's shared profile, has no running sample yet, and the
    sample's throughput disagrees with the estimate served for the job's
    placement shape (per GPU on the type, times its GPUs)."""
    known = served.by_job.get(sample.job_id)
    if known is None or not db.checks_reuse(sample.job_id, sample.gpu_type):
        return None
    signature, est = known
    curve = est.by_type.get(sample.gpu_type)
    if curve is None:
        return None
    per_gpu = (curve.agg_per_gpu(sample.local_gpus) if sample.nodes == 1
               else curve.dist_per_gpu(sample.nodes))
    estimated = per_gpu * sample.total_gpus
    measured = first_samples_disagree(estimated, (sample,), sample.total_gpus)
    if measured is None:
        return None
    return ev.ProfileStale(signature=signature, reason="disagreement", at=at,
                           gpu_types=(sample.gpu_type,), job_id=sample.job_id,
                           estimated=estimated, measured=measured)


def stale_msg_id(event: ev.ProfileStale) -> str:
    """The message id of an automatic ``profile_stale``: the same from every
    replica that sees the job's first sample."""
    return f"stale:{event.signature}:{','.join(event.gpu_types)}:{event.job_id}"


def apply_stale(db: ThroughputDatabase, event: ev.ProfileStale) -> tuple[GpuType, ...]:
    """Mark the event's profiles stale (no types named: all); the types
    that were current and are now stale."""
    types = frozenset(event.gpu_types) if event.gpu_types else None
    return db.mark_stale(Signature(event.signature), types)


def listing(db: ThroughputDatabase) -> ev.SignaturesReply:
    """Every signature's shared profiles: current and stale types, and the
    batch size its last report was measured with."""
    out = []
    for signature, types in db.shared.listing().items():
        current = tuple(t for t, stale in types.items() if not stale)
        stale = tuple(t for t, s in types.items() if s)
        batches = [r.batch_size for t in types if (r := db.shared.get(signature, t))]
        out.append(ev.SharedSignature(signature=signature, current=current, stale=stale,
                                      batch_size=max(batches, default=0)))
    return ev.SignaturesReply(signatures=tuple(out))
