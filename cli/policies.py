"""Policies by name for the command line and experiments: the registry of
the core (:mod:`scheduling.registry`) with the CLI's override flags.

``--policy`` takes a spec (``hops``, ``sia:lam=1.2``); ``--priority``,
``--lam`` and the like, when given, set that one setting of it, and are an
error for a policy that does not take it.
"""

from __future__ import annotations

from scheduling.policy import Policy
from scheduling.registry import (
    POLICIES,
    PolicyError,
    PolicySpec,
    parse_policy,
    with_settings,
)
from scheduling.registry import make_policy as _make

__all__ = ["POLICIES", "PolicyError", "make_policy", "resolve"]


def resolve(text: str, **overrides: object) -> PolicySpec:
    """The spec ``text`` names with the settings in ``overrides`` that are
    not ``None`` (the flags given)."""
    spec = parse_policy(text)
    given = {k: v for k, v in overrides.items() if v is not None}
    return with_settings(spec, given) if given else spec


def make_policy(name: str, priority: str | None = None, lam: float | None = None) -> Policy:
    """The policy spec ``name`` names; ``priority`` and ``lam``, when given,
    override its queue priority and its lambda."""
    return _make(resolve(name, priority=priority, lam=lam))
