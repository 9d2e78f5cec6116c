"""Policies by name, for the command line and experiments.

The mapping is configuration: the simulator and the services receive a
policy object and never look at its name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from services.scheduler.baselines.gavel import GavelPolicy, GavelSettings
from services.scheduler.baselines.sia import SiaPolicy, SiaSettings
from services.scheduler.planner import HopsPolicy, HopsSettings
from services.scheduler.policy import Policy


def _hops(priority: str, lam: float | None) -> Policy:
    return HopsPolicy(HopsSettings(priority=priority, lam=1.0 if lam is None else lam))


def _hops_profile_preempt(priority: str, lam: float | None) -> Policy:
    """Hops whose profiling may take a running job's GPU at a round boundary
    (the paper's profiling-first, §3.2; ``HopsSettings.profile_preempt``)."""
    lam = 1.0 if lam is None else lam
    return HopsPolicy(HopsSettings(priority=priority, lam=lam, profile_preempt=True))


def _sia(priority: str, lam: float | None) -> Policy:
    return SiaPolicy(SiaSettings(priority=priority, lam=1.1 if lam is None else lam))


def _sia_lp_start(priority: str, lam: float | None) -> Policy:
    """Sia with the LP optimum rounded down as its ILP's start
    (``SiaSettings.start``), for comparing solve times."""
    lam = 1.1 if lam is None else lam
    return SiaPolicy(SiaSettings(priority=priority, lam=lam, start="rounded-lp"))


def _gavel(priority: str, lam: float | None) -> Policy:
    return GavelPolicy(GavelSettings(priority=priority))


POLICIES: Mapping[str, Callable[[str, float | None], Policy]] = {
    "hops": _hops,
    "hops-profile-preempt": _hops_profile_preempt,
    "sia": _sia,
    "sia-lp-start": _sia_lp_start,
    "gavel": _gavel,
}


def make_policy(name: str, priority: str = "lr", lam: float | None = None) -> Policy:
    """A policy by name with its paper defaults; ``lam`` overrides its lambda
    (Hops' Eq. 11 knob, Sia's no-allocation penalty)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(priority, lam)
