"""Task policies by name: the names of hare.md's task-level policies, Hare
(``hare``, ``hare-eft``) and the baselines of §7.1 (``gavel-fifo``,
``srtf``, ``homo``, ``allox``). Their names, specs, settings and
construction are the registry's, in its one grammar (``hare:ties=order``,
:func:`scheduling.registry.make_task_policy`); this module names them for
the hare package's readers and builds on the registry, which does not
import it."""

from __future__ import annotations

from scheduling.policies.hare.model import TaskPolicy
from scheduling.registry import TASK_POLICIES as TASK_POLICIES
from scheduling.registry import make_task_policy


def task_policy(name: str) -> TaskPolicy:
    """A fresh policy from its spec text: one of :data:`TASK_POLICIES`,
    with its settings (``hare:ties=order``)."""
    return make_task_policy(name)
