"""Task policies by name: the one place that resolves ``hare``, ``hare-eft``
and the baselines of hare.md §7.1 (``gavel-fifo``, ``srtf``, ``homo``,
``allox``)."""

from __future__ import annotations

from scheduling.policies.hare.baselines import GavelFifo, Homo, Srtf
from scheduling.policies.hare.baselines_allox import Allox
from scheduling.policies.hare.model import TaskPolicy
from scheduling.policies.hare.policy import HarePolicy, HareSettings

TASK_POLICIES = ("hare", "hare-eft", "gavel-fifo", "srtf", "homo", "allox")


def task_policy(name: str) -> TaskPolicy:
    """A fresh policy named ``name`` (one of :data:`TASK_POLICIES`)."""
    if name == "hare":
        return HarePolicy(HareSettings(placement="earliest-free"))
    if name == "hare-eft":
        return HarePolicy(HareSettings(placement="earliest-finish"))
    if name == "gavel-fifo":
        return GavelFifo()
    if name == "srtf":
        return Srtf()
    if name == "homo":
        return Homo()
    if name == "allox":
        return Allox()
    raise ValueError(f"unknown task policy {name!r}; known: {', '.join(TASK_POLICIES)}")
