"""Sia's allocation ILP as arrays (:mod:`.sia`): its columns, the model
HiGHS solves, and the same columns indexed for :mod:`.start` and
:mod:`.ties`.

One binary column per (job, GPU type, requirement); row j: job j takes at
most one column; row t: the columns on type t use at most its free GPUs
(Sia §3.3; the artifact's ``__solve_mip_rescaled``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scheduling.ilp import INF, MipModel
from scheduling.policies.sia.start import Columns
from shared.ids import GpuType, JobId
from shared.snapshot import JobState


@dataclass(frozen=True, slots=True)
class SiaColumn:
    """One (job, GPU type, requirement) configuration of the ILP."""

    job_id: JobId
    gpu_type: GpuType
    gpus: int
    nodes: int
    gain: float  # normalised goodput G (before the restart factor)
    coeff: float  # objective coefficient


def build_model(
    jobs: Sequence[JobState], columns: Sequence[SiaColumn], capacity: Mapping[GpuType, int]
) -> MipModel:
    """The ILP (to maximise): one row per job (in queue order), then one per
    type (in ``capacity``'s order), then the columns in one block."""
    model = MipModel()
    job_row_of = {j.id: model.add_row(-INF, 1.0) for j in jobs}
    type_row_of = {t: model.add_row(-INF, float(g)) for t, g in capacity.items()}
    # Column k: 1 in its job's row, its GPU count in its type's row.
    n = len(columns)
    rows = np.empty(2 * n, dtype=np.int64)
    rows[0::2] = [job_row_of[c.job_id] for c in columns]
    rows[1::2] = [type_row_of[c.gpu_type] for c in columns]
    values = np.ones(2 * n)
    values[1::2] = [c.gpus for c in columns]
    ends = np.arange(2, 2 * n + 1, 2, dtype=np.int64)
    costs = [c.coeff for c in columns]
    model.add_cols(costs, np.ones(n), integer=True, ends=ends, rows=rows, values=values)
    return model


def index_columns(
    jobs: Sequence[JobState], columns: Sequence[SiaColumn], capacity: Mapping[GpuType, int]
) -> Columns:
    """The columns as arrays, jobs numbered by queue rank and types in
    ``capacity``'s order."""
    job_index = {j.id: i for i, j in enumerate(jobs)}
    type_index = {t: i for i, t in enumerate(capacity)}
    return Columns(
        job=np.array([job_index[c.job_id] for c in columns], dtype=np.int64),
        gpu_type=np.array([type_index[c.gpu_type] for c in columns], dtype=np.int64),
        gpus=np.array([c.gpus for c in columns], dtype=np.int64),
        coeff=np.array([c.coeff for c in columns], dtype=np.float64),
        jobs=len(jobs),
        capacity=tuple(capacity.values()),
    )
