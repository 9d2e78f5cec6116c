"""Hare's task scheduler (hare.md §5.2, Algorithm 1) behind the TaskPolicy
protocol: the relaxation (:mod:`.relax`, line 3) orders the tasks, the greedy
(:mod:`.greedy`, lines 4-17) places them.

``hare`` is Algorithm 1 as written (earliest-free GPU, line 12);
``hare-eft`` places each task on the GPU where it finishes first.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from scheduling.policies.hare.greedy import PLACEMENTS, TIES, greedy
from scheduling.policies.hare.model import TaskProblem, TaskSchedule
from scheduling.policies.hare.relax import relax


class HareSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``placement``: ``earliest-free`` is line 12 of Algorithm 1,
    ``earliest-finish`` its earliest-finish-time variant. ``ties``: how
    line 12 breaks ties between GPUs free at the same time, which the paper
    leaves open (:mod:`.greedy`): the one fastest for the task, or GPU order."""

    placement: Literal["earliest-free", "earliest-finish"] = "earliest-free"
    ties: Literal["fastest", "order"] = "fastest"

    def __post_init__(self) -> None:
        # msgspec checks the Literal when decoding, not on direct construction.
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, not {self.placement!r}")
        if self.ties not in TIES:
            raise ValueError(f"ties must be one of {TIES}, not {self.ties!r}")


class HarePolicy:
    """Algorithm 1: relax, then place in order of the middle completion times.
    The schedule's ``lower_bound`` is the relaxation's optimum."""

    def __init__(self, settings: HareSettings | None = None) -> None:
        self.settings = settings or HareSettings()
        base = "hare" if self.settings.placement == "earliest-free" else "hare-eft"
        self.name = base if self.settings.ties == "fastest" else f"{base}:ties=order"

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        relaxed = relax(problem)
        tasks = greedy(problem, relaxed.starts, self.settings.placement, self.settings.ties)
        return TaskSchedule(tasks, lower_bound=relaxed.objective)
