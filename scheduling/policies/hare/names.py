"""Task policies by name: the one place that resolves ``hare``, ``hare-eft``
and the baselines of hare.md §7.1 (``gavel-fifo``, ``srtf``, ``homo``,
``allox``)."""

from __future__ import annotations

from typing import Literal

from scheduling.policies.hare.baselines import GavelFifo, Homo, Srtf
from scheduling.policies.hare.baselines_allox import Allox
from scheduling.policies.hare.model import TaskPolicy
from scheduling.policies.hare.policy import HarePolicy, HareSettings

TASK_POLICIES = ("hare", "hare-eft", "gavel-fifo", "srtf", "homo", "allox")


ORDER_TIES = ":ties=order"  # Hare's line 12 breaking ties by GPU order (greedy.py)


def task_policy(name: str) -> TaskPolicy:
    """A fresh policy named ``name``: one of :data:`TASK_POLICIES`, or
    ``hare`` / ``hare-eft`` with ``:ties=order``."""
    base = name.removesuffix(ORDER_TIES)
    ties: Literal["fastest", "order"] = "order" if base != name else "fastest"
    if base == "hare":
        return HarePolicy(HareSettings(placement="earliest-free", ties=ties))
    if base == "hare-eft":
        return HarePolicy(HareSettings(placement="earliest-finish", ties=ties))
    if name == "gavel-fifo":
        return GavelFifo()
    if name == "srtf":
        return Srtf()
    if name == "homo":
        return Homo()
    if name == "allox":
        return Allox()
    raise ValueError(f"unknown task policy {name!r}; known: {', '.join(TASK_POLICIES)}")
