"""Relaxed-sync workloads for the task-level simulator (hare.md §7.1,
"Workload"), drawn deterministically from a caller's numpy Generator.

The rule
--------
* **Models**: the stand-ins of :mod:`world.hare` for Table 2's eight models,
  in four categories, CV, NLP, Speech and Rec.; a job's category is drawn
  from ``mix`` (25% each by default, §7.1), then its model uniformly among the
  category's.
* **Sync scale** (tasks per round, |D_r|): uniform over ``scales``, {1, 2, 4,
  8} by default (the paper does not state its scales; 8 is the testbed's
  V100 count, so every job fits one type of every cluster here).
* **Length**: the job's *ideal duration*, every round on S GPUs of the
  model's fastest type (T^c + T^s), is log-uniform within its category's
  ``minutes`` range; rounds = that over the round time, at least 1. NLP jobs
  are the longest and Rec. the shortest, as §7.3 describes them ("NLP jobs
  involve heavier training workloads", "recognition jobs ... less
  workloads"): CV 5-60 min, NLP 10-120, Speech 5-60, Rec. 2-20 by default,
  so that jobs last minutes to hours (10^3-10^5 rounds).
* **Weight**: uniform over ``weights``, all 1 by default (§7 does not state
  its weights).
* **Arrivals**: a Poisson process from t = 0 whose rate makes the offered
  load ``load``: the jobs' ideal GPU time (S x ideal duration) over the
  cluster's GPUs and the arrival span. The paper replays the Google cluster
  trace's arrivals (§7.1, ref. [3]); we do not have it, so this is a
  stated departure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec
import numpy as np

from scheduling.policies.hare.model import Gpu, GpuId, TaskJob
from shared.ids import GpuType, JobId
from world.hare import CATEGORIES, Category, TaskModel

MIX: dict[str, float] = {c: 0.25 for c in CATEGORIES}
MINUTES: dict[str, tuple[float, float]] = {
    "CV": (5.0, 60.0), "NLP": (10.0, 120.0), "Speech": (5.0, 60.0), "Rec": (2.0, 20.0),
}


class HareWorkload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The parameters of the rule in the module docstring."""

    jobs: int = 200
    mix: dict[str, float] = msgspec.field(default_factory=lambda: dict(MIX))
    scales: tuple[int, ...] = (1, 2, 4, 8)
    minutes: dict[str, tuple[float, float]] = msgspec.field(
        default_factory=lambda: dict(MINUTES))
    weights: tuple[float, ...] = (1.0,)
    load: float = 1.0

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.load <= 0:
            raise ValueError("need jobs >= 1 and load > 0")
        if set(self.mix) - set(CATEGORIES) or sum(self.mix.values()) <= 0:
            raise ValueError(f"mix: categories are {CATEGORIES}, with a positive total")
        if not self.scales or min(self.scales) < 1 or not self.weights:
            raise ValueError("need scales >= 1 and at least one weight")
        if any(not 0 < lo <= hi for lo, hi in self.minutes.values()):
            raise ValueError("minutes: need 0 < low <= high")


def ideal_round_s(model: TaskModel) -> float:
    """A round of the model on its fastest type: T^c + T^s there."""
    return min(model.round_s(t) for t in model.compute_s)


def _draw_job(i: int, spec: HareWorkload, models: Mapping[str, TaskModel],
              rng: np.random.Generator) -> tuple[TaskJob, float]:
    """Job ``i`` (arrival to be set) and its ideal GPU time."""
    cats = [c for c in CATEGORIES if spec.mix.get(c, 0.0) > 0]
    p = np.array([spec.mix[c] for c in cats]) / sum(spec.mix[c] for c in cats)
    category: Category = cats[int(rng.choice(len(cats), p=p))]
    names = [m.name for m in models.values() if m.category == category]
    model = models[names[int(rng.integers(len(names)))]]
    scale = spec.scales[int(rng.integers(len(spec.scales)))]
    lo, hi = spec.minutes[category]
    ideal = 60.0 * math.exp(rng.uniform(math.log(lo), math.log(hi)))
    rounds = max(1, round(ideal / ideal_round_s(model)))
    weight = spec.weights[int(rng.integers(len(spec.weights)))]
    job = TaskJob(
        id=JobId(f"h{i:03d}"), arrival_s=0.0, rounds=rounds, tasks_per_round=scale,
        compute_s=dict(model.compute_s), sync_s=dict(model.sync_s), weight=weight,
        model=model.name,
    )
    return job, scale * rounds * ideal_round_s(model)


def generate(spec: HareWorkload, models: Mapping[str, TaskModel], gpus: int,
             rng: np.random.Generator) -> tuple[TaskJob, ...]:
    """``spec.jobs`` jobs for a cluster of ``gpus`` GPUs (module docstring)."""
    if gpus < 1:
        raise ValueError("gpus must be >= 1")
    drawn = [_draw_job(i, spec, models, rng) for i in range(spec.jobs)]
    work = sum(w for _, w in drawn)
    span = work / (spec.load * gpus)
    rate = spec.jobs / span
    gaps = rng.exponential(1.0 / rate, size=spec.jobs - 1)
    arrivals = np.concatenate(([0.0], np.cumsum(gaps)))
    return tuple(msgspec.structs.replace(job, arrival_s=float(a))
                 for (job, _), a in zip(drawn, arrivals, strict=True))


def cluster_gpus(shape: Mapping[GpuType, int]) -> tuple[Gpu, ...]:
    """The GPUs of a cluster shape (``v100-000``, ...), all free, numbered
    so that every type is spread evenly over the order (GPU i of n of a
    type sits at (i + 1/2) / n): ties broken by GPU order, and Sched_Homo's
    "first free GPUs", then favour no type."""
    spread = sorted(((i + 0.5) / n, k, t, i) for k, (t, n) in enumerate(shape.items())
                    for i in range(n))
    return tuple(Gpu(GpuId(f"{t.lower()}-{i:03d}"), t) for _, _, t, i in spread)
