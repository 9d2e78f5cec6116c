"""Policies by name for the command line: the registry of the core
(:mod:`scheduling.registry`) with the CLI's override flags.

``--policy`` takes a spec (``hops``, ``sia:lam=1.2``); ``--priority``,
``--lam`` and the like, when given, set that one setting of it
(:func:`scheduling.registry.resolve`), and are an error for a policy that
does not take it.
"""

from __future__ import annotations

from scheduling.policy import Policy
from scheduling.registry import POLICIES, PolicyError, resolve
from scheduling.registry import make_policy as _make

__all__ = ["POLICIES", "PolicyError", "make_policy", "resolve"]


def make_policy(name: str, priority: str | None = None, lam: float | None = None) -> Policy:
    """The policy spec ``name`` names; ``priority`` and ``lam``, when given,
    override its queue priority and its lambda."""
    return _make(resolve(name, priority=priority, lam=lam))
