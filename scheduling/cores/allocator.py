"""CODA's adaptive CPU allocator (CODA §V-B): find, by measuring, how many CPU
cores a GPU training job needs.

A job starts at N_start (§V-B-1, :func:`start_point`): the largest core count
its owner's earlier jobs of the same category settled on, else the category's
default (CV 3, NLP 5, speech 5), adjusted by the owner's hints (pipelined data
loading -1, many weights -1, heavy preprocessing between iterations +1).

The climb then tunes it (§V-B-2, :func:`begin`, :func:`observe`), one profiling
step (90 s, §VI-F) per sample:

1. measure at the start, then try one core fewer;
2. going *down*, a step is kept while the throughput does not fall by more
   than ``threshold`` below the best measured so far: fewer cores at the same
   speed free cores for others (CODA's slimming; a real gain counts too), and
   the climb keeps going down;
3. when a step down loses (or the floor is reached), the climb turns *up* from
   the best point: it tries best + 1 and keeps going up while the throughput
   rises by more than ``threshold`` above the best;
4. it settles on the best point when neither direction helps, or after
   ``max_steps`` samples. A point already measured is never measured again:
   its recorded throughput decides.

So on a plateau the climb walks down to the floor (or the first loss), and a
step up that gains nothing ends the climb. The unit is cores **per GPU**
(this project's choice, from §IV-B-2: on one server a job's CPU demand is
linear in its GPUs); a job gets ``per_gpu`` x its GPUs on each server
(:func:`server_cores`). Every function is pure and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import msgspec

from shared.job import Category, CoreHints

Phase = Literal["start", "down", "up", "settled"]


class ClimbSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Settings of the allocator; each says whether the paper fixes it.

    ``period_s``: one profiling step, 90 s (paper, §VI-F).
    ``threshold``: the relative change of throughput that counts as better
    or worse, 2% (this project's choice; the paper leaves it open).
    ``max_steps``: samples before the climb settles anyway, 8 (project's
    choice; the paper's Table II needs at most 4).
    ``min_per_gpu``: the floor, 1 core per GPU (project's choice).
    ``start_cv``, ``start_nlp``, ``start_speech``: N_start of a tenant's first
    job, 3, 5 and 5 (paper, §V-B-1); ``start_other`` for a job without a
    category, 3 (project's choice: the paper then uses history only)."""

    period_s: float = 90.0
    threshold: float = 0.02
    max_steps: int = 8
    min_per_gpu: int = 1
    start_cv: int = 3
    start_nlp: int = 5
    start_speech: int = 5
    start_other: int = 3

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must lie in [0, 1), got {self.threshold}")
        if self.max_steps < 1 or self.min_per_gpu < 1:
            raise ValueError("max_steps and min_per_gpu must be >= 1")
        starts = (self.start_cv, self.start_nlp, self.start_speech, self.start_other)
        if min(starts) < 1:
            raise ValueError("category defaults must be >= 1")

    def default_start(self, category: Category) -> int:
        """N_start of a tenant's first job of ``category``."""
        return {"cv": self.start_cv, "nlp": self.start_nlp, "speech": self.start_speech,
                "other": self.start_other}[category]


DEFAULT_SETTINGS = ClimbSettings()


def start_point(category: Category, hints: CoreHints, history: Sequence[int],
                settings: ClimbSettings = DEFAULT_SETTINGS) -> int:
    """N_start in cores per GPU (§V-B-1). ``history``: the cores per GPU the
    owner's earlier jobs of the same category settled on (any order; the
    largest counts); empty for a first job."""
    start = max(history) if history else settings.default_start(category)
    if hints.pipeline:
        start -= 1
    if hints.many_weights:
        start -= 1
    if hints.complex_preprocessing:
        start += 1
    return max(start, settings.min_per_gpu)


class Climb(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One job's climb. ``current``: the cores per GPU to run at now (the
    point to measure next; once settled, the answer). ``best``: the point the
    climb would settle on now; ``best_throughput``: the reference the next
    sample is judged against (the highest throughput of the points kept).
    ``phase``: before the first sample, going down, going up, or settled.
    ``samples``: (cores per GPU, throughput) measured so far, in order.
    ``ceiling``: the most cores per GPU the job may get."""

    current: int
    best: int
    ceiling: int
    best_throughput: float = 0.0
    phase: Phase = "start"
    samples: tuple[tuple[int, float], ...] = ()

    @property
    def settled(self) -> bool:
        return self.phase == "settled"

    @property
    def steps(self) -> int:
        """Samples taken (profiling steps spent)."""
        return len(self.samples)

    def tried(self) -> tuple[int, ...]:
        """The points measured, in order."""
        return tuple(c for c, _ in self.samples)


def begin(start: int, max_per_gpu: int, settings: ClimbSettings = DEFAULT_SETTINGS) -> Climb:
    """A climb from ``start`` cores per GPU, kept within
    [``settings.min_per_gpu``, ``max_per_gpu``]."""
    if max_per_gpu < settings.min_per_gpu:
        raise ValueError(f"max_per_gpu {max_per_gpu} is below the floor {settings.min_per_gpu}")
    first = min(max(start, settings.min_per_gpu), max_per_gpu)
    return Climb(current=first, best=first, ceiling=max_per_gpu)


def _judge(climb: Climb, point: int, throughput: float, settings: ClimbSettings) -> Climb:
    """Update best and phase with one (possibly recorded) sample at ``point``."""
    ref = climb.best_throughput
    if climb.phase == "start":
        return msgspec.structs.replace(climb, best=point, best_throughput=throughput,
                                       phase="down")
    if climb.phase == "down":
        if throughput >= ref * (1.0 - settings.threshold):
            return msgspec.structs.replace(climb, best=point,
                                           best_throughput=max(ref, throughput))
        return msgspec.structs.replace(climb, phase="up")
    if throughput > ref * (1.0 + settings.threshold):
        return msgspec.structs.replace(climb, best=point, best_throughput=throughput)
    return msgspec.structs.replace(climb, phase="settled")


def _advance(climb: Climb, settings: ClimbSettings) -> Climb:
    """Choose the next point to measure, deciding from recorded samples where
    the candidate was measured before; settle when nothing is left to try."""
    recorded = dict(climb.samples)
    while not climb.settled:
        if climb.steps >= settings.max_steps:
            climb = msgspec.structs.replace(climb, phase="settled")
            break
        candidate = climb.best - 1 if climb.phase == "down" else climb.best + 1
        if not settings.min_per_gpu <= candidate <= climb.ceiling:
            turn: Phase = "up" if climb.phase == "down" else "settled"
            climb = msgspec.structs.replace(climb, phase=turn)
        elif candidate in recorded:
            climb = _judge(climb, candidate, recorded[candidate], settings)
        else:
            return msgspec.structs.replace(climb, current=candidate)
    return msgspec.structs.replace(climb, current=climb.best)


def observe(climb: Climb, throughput: float,
            settings: ClimbSettings = DEFAULT_SETTINGS) -> Climb:
    """Record ``throughput`` (any unit where more is better: samples/s, GPU
    utilisation) measured at ``climb.current``, and pick the next point to
    measure or settle. A settled climb is returned unchanged."""
    if climb.settled:
        return climb
    if not (math.isfinite(throughput) and throughput >= 0):
        raise ValueError(f"throughput must be finite and >= 0, got {throughput}")
    point = climb.current
    judged = _judge(climb, point, throughput, settings)
    recorded = msgspec.structs.replace(judged, samples=(*climb.samples, (point, throughput)))
    return _advance(recorded, settings)


def server_cores(per_gpu: int, gpus: int) -> int:
    """A job's cores on one server: ``per_gpu`` for each of its GPUs there."""
    if per_gpu < 0 or gpus < 0:
        raise ValueError("per_gpu and gpus must be >= 0")
    return per_gpu * gpus
