"""Hare's task scheduler (hare.md §5.2, Algorithm 1) behind the TaskPolicy
protocol: the relaxation (:mod:`.relax`, line 3) orders the tasks, the greedy
(:mod:`.greedy`, lines 4-17) places them.

``hare`` is Algorithm 1 as written (earliest-free GPU, line 12);
``hare-eft`` places each task on the GPU where it finishes first.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from scheduling.policies.hare.greedy import PLACEMENTS, greedy
from scheduling.policies.hare.model import TaskProblem, TaskSchedule
from scheduling.policies.hare.relax import relax


class HareSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``placement``: ``earliest-free`` is line 12 of Algorithm 1,
    ``earliest-finish`` its earliest-finish-time variant."""

    placement: Literal["earliest-free", "earliest-finish"] = "earliest-free"

    def __post_init__(self) -> None:
        # msgspec checks the Literal when decoding, not on direct construction.
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, not {self.placement!r}")


class HarePolicy:
    """Algorithm 1: relax, then place in order of the middle completion times.
    The schedule's ``lower_bound`` is the relaxation's optimum."""

    def __init__(self, settings: HareSettings | None = None) -> None:
        self.settings = settings or HareSettings()
        self.name = "hare" if self.settings.placement == "earliest-free" else "hare-eft"

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        relaxed = relax(problem)
        tasks = greedy(problem, relaxed.starts, self.settings.placement)
        return TaskSchedule(tasks, lower_bound=relaxed.objective)
