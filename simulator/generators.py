"""The literal reading of the paper's requirement sets (Hops §4.2).

The paper states only that "the GPU requirements are between 1 and 16 GPUs,
with each user able to select up to 8 different requirements". Read
literally: k uniform in 1..8, then k distinct GPU counts uniform over 1..16,
independent of the job's length. The project's own rule
(:func:`simulator.workloads.requirement_set`, which ties the sizes to the
job's Table 2 category) is an assumption beside it.

The sets come from their own random stream, ``default_rng([seed, 1])``, so a
``*-literal`` generator keeps the arrivals, models and lengths that the
project generator draws for the same seed.
"""

from __future__ import annotations

import numpy as np

MAX_GPUS = 16
MAX_CHOICES = 8
LITERAL_STREAM = 1  # the requirement sets' stream: default_rng([seed, LITERAL_STREAM])


def requirement_set_literal(rng: np.random.Generator) -> tuple[int, ...]:
    """k uniform in 1..8, then k distinct GPU counts uniform over 1..16 (sorted)."""
    k = int(rng.integers(1, MAX_CHOICES + 1))
    counts = rng.choice(np.arange(1, MAX_GPUS + 1), size=k, replace=False)
    return tuple(sorted(int(g) for g in counts))


def literal_sets(n: int, seed: int) -> list[tuple[int, ...]]:
    """The requirement sets of a workload's first ``n`` jobs for ``seed``."""
    rng = np.random.default_rng([seed, LITERAL_STREAM])
    return [requirement_set_literal(rng) for _ in range(n)]
