"""CODA's settings (Zhao et al. ICDCS'20): the adaptive allocator's and the
multi-array scheme's, read by the core layer (:mod:`.layer`), its CPU side
(:mod:`.cpu_side`) and the GPU sub-arrays (:mod:`.subarrays`), and extended
by the registry's ``coda`` spec."""

from __future__ import annotations

from scheduling.cores.allocator import ClimbSettings


class CodaSettings(ClimbSettings, frozen=True, forbid_unknown_fields=True):
    """CODA's settings: the adaptive allocator's (§V-B,
    :class:`~.allocator.ClimbSettings`) and the multi-array scheme's
    (§V-C): ``large_job_gpus`` splits the
    GPU array (the paper's 4); ``reserve_per_gpu`` cores reserved per GPU
    (0: from history, the paper's rule; before any job settled, the CV
    start of the allocator); ``cpu_wait_bound_s`` (this project's choice)
    bounds a CPU job's wait (:mod:`.layer`); ``subarrays`` turns the GPU
    sub-arrays off; ``eliminate`` the contention eliminator (§V-D; off
    for §VI-E's ablation)."""

    large_job_gpus: int = 4
    reserve_per_gpu: float = 0.0
    cpu_wait_bound_s: float = 1800.0
    subarrays: bool = True
    eliminate: bool = True
