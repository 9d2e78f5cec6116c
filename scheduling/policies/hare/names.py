"""Task policies by name: the names of hare.md's task-level policies, Hare
(``hare``, ``hare-eft``) and the baselines of §7.1 (``gavel-fifo``,
``srtf``, ``homo``, ``allox``). Their specs, settings and construction are
the registry's, in its one grammar (``hare:ties=order``,
:func:`scheduling.registry.make_task_policy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduling.policies.hare.model import TaskPolicy

TASK_POLICIES = ("hare", "hare-eft", "gavel-fifo", "srtf", "homo", "allox")


def task_policy(name: str) -> TaskPolicy:
    """A fresh policy from its spec text: one of :data:`TASK_POLICIES`,
    with its settings (``hare:ties=order``)."""
    # The registry builds on this module's names: imported when called.
    from scheduling.registry import make_task_policy

    return make_task_policy(name)
