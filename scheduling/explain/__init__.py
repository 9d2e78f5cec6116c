"""Reasons: why each job of a plan is not running, and why a running job
was stopped (shared.explain). Pure functions of the snapshot and the plan,
so that the live leader and the simulator compute the same ones.

PLACEHOLDER: the signatures are the contract; the implementation lands with
the reasons work (see docs/explain.md once written).
"""

from __future__ import annotations

from collections.abc import Collection

from shared.explain import Receipt, Why
from shared.ids import JobId, ServerId
from shared.snapshot import Plan, Snapshot


def explain(snapshot: Snapshot, plan: Plan, *, drained: Collection[ServerId] = (),
            next_plan_at: float = 0.0) -> dict[JobId, Why]:
    """The primary reason of every job of ``snapshot`` that ``plan`` does not run."""
    return {}


def with_reasons(snapshot: Snapshot, plan: Plan, *, drained: Collection[ServerId] = (),
                 next_plan_at: float = 0.0) -> Plan:
    """``plan`` with :func:`explain`'s reasons in ``plan.reasons.why``."""
    return plan


def receipts(snapshot: Snapshot, plan: Plan, *, drained: Collection[ServerId] = (),
             lost: Collection[ServerId] = (), round_no: int = 0) -> tuple[Receipt, ...]:
    """One receipt per running job of ``snapshot`` that the first plan
    ``plan`` stops or moves."""
    return ()
