"""Tiresias' discretised 2D-LAS queues (Gu et al., "Tiresias: A GPU Cluster
Manager for Distributed Deep Learning", NSDI'19, §3.2): a job's attained
service is its GPUs times the time it ran; queue i holds the jobs whose
service lies in [Q_i^lo, Q_i^hi), Q_1^lo = 0 and Q_K^hi = inf, so a job
enters the first queue and is demoted as its service crosses a threshold.
Within a queue, jobs go in the order they first started (FIFO), jobs not
yet started after them by arrival.

Starvation: a job that has waited PROMOTEKNOB times longer than it ran,
both counted since it was last promoted (or since it first started), is
promoted to the first queue, and both counts restart from zero, so that
it is not demoted right away (§3.2, "Avoiding starvation"; the artifact's
``dlas_sim_jobs``, where promotion applies to jobs beyond the first queue).

The counts since the last promotion are the policy's state
(:class:`Marks`), kept between plans in the plan's layer state under
:data:`STATE`; the snapshot's cumulative ``attained_gpu_s`` and ``wait_s``
give the rest.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import msgspec

from shared.ids import JobId
from shared.snapshot import JobState

STATE = "tiresias-queues"  # the LayerRecord name the state travels under


class Marks(msgspec.Struct, frozen=True, array_like=True):
    """A job's attained GPU-seconds and wait when its counts last restarted
    (its first start, or its last promotion), when it first started, and
    how often it was promoted."""

    service: float
    wait: float
    first_start: float
    promotions: int = 0


class QueueState(msgspec.Struct, frozen=True):
    """Every started job's marks."""

    jobs: dict[JobId, Marks] = {}


def decode(blob: bytes | None) -> QueueState:
    return msgspec.msgpack.decode(blob, type=QueueState) if blob else QueueState()


def encode(state: QueueState) -> bytes:
    return msgspec.msgpack.encode(state)


def queue_index(service: float, thresholds: Sequence[float]) -> int:
    """The queue of a job with ``service`` GPU-seconds: 0 below the first
    threshold, i once the i-th is reached (``thresholds`` ascending)."""
    return bisect.bisect_right(thresholds, service)


def run_since(job: JobState, marks: Marks, gpus: int) -> float:
    """Seconds the job ran since its marks (its GPU count is fixed)."""
    return max(0.0, job.attained_gpu_s - marks.service) / max(1, gpus)


def starving(job: JobState, marks: Marks, gpus: int, knob: float) -> bool:
    """PROMOTEKNOB's rule: waiting since the marks at least ``knob`` times
    the time run since them (a job that has not run since is left alone;
    ``knob`` 0 turns promotion off)."""
    ran = run_since(job, marks, gpus)
    return knob > 0 and ran > 0 and job.wait_s - marks.wait >= knob * ran


def advance(
    state: QueueState,
    jobs: Mapping[JobId, JobState],
    gpus: Mapping[JobId, int],
    thresholds: Sequence[float],
    knob: float,
    now: float,
) -> tuple[dict[JobId, Marks], dict[JobId, int]]:
    """Each job's marks and queue at ``now``: a started job without marks
    (its start was not seen) is marked now; a waiting job beyond the first
    queue that starves is promoted."""
    marks: dict[JobId, Marks] = {}
    queues: dict[JobId, int] = {}
    for jid, job in jobs.items():
        m = state.jobs.get(jid)
        if m is None and (job.attained_gpu_s > 0 or job.phase == "running"):
            m = Marks(0.0, job.wait_s, now)
        if m is None:
            queues[jid] = 0
            continue
        q = queue_index(job.attained_gpu_s - m.service, thresholds)
        if q > 0 and job.phase == "queued" and starving(job, m, gpus[jid], knob):
            m = Marks(job.attained_gpu_s, job.wait_s, m.first_start, m.promotions + 1)
            q = 0
        marks[jid], queues[jid] = m, q
    return marks, queues


def started(marks: Mapping[JobId, Marks], job: JobState, now: float) -> Marks:
    """The marks of ``job`` once a plan starts it: unchanged if it started
    before, else counts from here."""
    return marks.get(job.id) or Marks(job.attained_gpu_s, job.wait_s, now)


def order(jobs: Mapping[JobId, JobState], queues: Mapping[JobId, int],
          marks: Mapping[JobId, Marks]) -> list[JobId]:
    """Queue by queue; within one, by first start, then arrival, then id."""
    def key(jid: JobId) -> tuple[int, float, float, str]:
        m = marks.get(jid)
        return (queues[jid], m.first_start if m is not None else math.inf,
                jobs[jid].spec.submit_time, jid)
    return sorted(jobs, key=key)
