"""Service window and sensitivity adjustment (Hops §3.6, Figure 5).

Both take the queue already sorted by priority (highest first) and return
which jobs a planning pass may consider.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from shared.ids import JobId


class QueueEntry(msgspec.Struct, frozen=True):
    """A job as the window sees it."""

    job_id: JobId
    min_gpus: int
    rho: float  # Eq. (10), one value per job


def service_window(queue: Sequence[QueueEntry], capacity: int) -> list[QueueEntry]:
    """The head of the queue whose minimum requirements first reach ``capacity``.

    Traverse from the head accumulating each job's minimum requirement until
    the sum is >= the resources; the job that crosses the line is the window's
    last member. Everything after it gets no chance this pass.
    """
    window: list[QueueEntry] = []
    total = 0
    for entry in queue:
        if total >= capacity:
            break
        window.append(entry)
        total += entry.min_gpus
    return window


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v != float("inf")]
    return sum(finite) / len(finite) if finite else float("inf")


def sensitivity_adjustment(
    queue: Sequence[QueueEntry], window: Sequence[QueueEntry], idle_gpus: int
) -> list[QueueEntry]:
    """Admit low-sensitivity jobs from behind the window for a fragment plan.

    If the window's mean sensitivity rho_set exceeds the queue's rho_queue,
    walk the queue from the window boundary towards the tail and admit every
    job with rho_i < rho_queue whose minimum requirement fits in the idle
    GPUs, until rho_set <= rho_queue (erratum: the paper's stop test) or the
    queue ends. Returns the admitted jobs in queue order.
    """
    rho_queue = _mean([e.rho for e in queue])
    members = list(window)
    if not members or _mean([e.rho for e in members]) <= rho_queue:
        return []
    admitted: list[QueueEntry] = []
    for entry in queue[len(window) :]:
        if entry.rho < rho_queue and entry.min_gpus <= idle_gpus:
            admitted.append(entry)
            members.append(entry)
            if _mean([e.rho for e in members]) <= rho_queue:
                break
    return admitted


def order_queue(priorities: Mapping[JobId, float], submit: Mapping[JobId, float]) -> list[JobId]:
    """Highest priority first; ties go to the earlier submission, then the id,
    so the order is total and the plan deterministic."""
    return sorted(priorities, key=lambda j: (-priorities[j], submit[j], j))
