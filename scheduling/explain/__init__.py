"""Reasons: why each job of a plan is not running, and why a running job
was stopped (shared.explain). Pure functions of the snapshot and the plan,
so that the live leader and the simulator compute the same ones
(docs/explain.md, "Reasons").

- :func:`explain` / :func:`with_reasons`: one primary reason per job the
  plan does not run (:mod:`.reasons` gives the order);
- :func:`receipts`: why a round's first plan stopped or moved a running job
  (:mod:`.receipts`);
- the record-level reasons of jobs outside every snapshot and the layers'
  own reasons (:mod:`.records`).
"""

from __future__ import annotations

from scheduling.explain.reasons import explain, running_after, with_reasons
from scheduling.explain.receipts import receipts
from scheduling.explain.records import (
    cells_why,
    cores_why,
    drained_why,
    held_why,
    is_reclaim,
    quota_why,
    reclaimed_why,
    unschedulable_why,
)

__all__ = [
    "cells_why", "cores_why", "drained_why", "explain", "held_why", "is_reclaim", "quota_why",
    "receipts", "reclaimed_why", "running_after", "unschedulable_why", "with_reasons",
]
