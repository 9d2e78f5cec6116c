"""The types a planning pass takes and gives (:mod:`scheduling.policies.hops.passes`):
its jobs with their Eq. (11) weights, the solver's knobs, and each job's
chosen configuration with its gain G_ij (Table 1). They live apart from the
pass so that :mod:`~scheduling.policies.hops.proof`, which the pass calls,
can name them without importing the pass back."""

from __future__ import annotations

import msgspec

from scheduling.ilp import MipOptions
from scheduling.policies.hops.candidates import DEFAULT_SIGMA
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId


class PassJob(msgspec.Struct, frozen=True):
    """A job allowed into this pass."""

    job_id: JobId
    weight: float  # (prior + bias)^lambda, computed by the caller (Eq. 11)
    requirements: tuple[int, ...]  # sorted R
    rho: dict[GpuType, float]  # Eq. (10) per type
    estimate: JobEstimate
    current: Configuration | None = None  # last round's configuration (warm start)
    # Multiplies the gain of every option except ``current``: the share of a
    # round that a checkpoint-restart costs is lost by moving or starting.
    switch_factor: float = 1.0
    # Added to the coefficient of ``current`` (in the callers' weight units,
    # rescaled with the weights): a running job's hysteresis against a
    # restart (HopsSettings.preempt_margin).
    keep_bonus: float = 0.0


# Largest direct model; beyond it the class formulation (its one definition:
# the planner's setting defaults to it).
DIRECT_MAX_COLUMNS = 5000
_MIP = MipOptions()  # the solver's defaults are the passes'


class SolverSettings(msgspec.Struct, frozen=True):
    """Knobs of a pass. ``threads`` must not change within a process (HiGHS
    fixes its thread pool at the first solve)."""

    sigma: float = DEFAULT_SIGMA
    mip_rel_gap: float = _MIP.mip_rel_gap
    time_limit_s: float = _MIP.time_limit_s
    threads: int = _MIP.threads
    direct_max_columns: int = DIRECT_MAX_COLUMNS
    greedy: bool = False  # the lambda -> infinity limit of Eq. (11)
    max_patterns: int = 20000
    random_seed: int = 0
    # A start within accept_gap of the LP bound is the pass's answer (see
    # scheduling.policies.hops.proof.settled); the restricted model stops after
    # restrict_nodes B&B nodes.
    accept_gap: float = 0.05
    restrict_nodes: int = 200
    # Departures from Eq. (11) (HopsSettings documents them, and takes these
    # defaults): a speed-up counted per GPU of the job (off), a floor on the
    # gain a same-size move must bring and kept jobs pinned to their servers
    # (on; ``hops-paper`` turns them off).
    gain_per_gpu: bool = False
    move_min_gain: float = 0.05
    keep_in_place_partial: bool = True


class Choice(msgspec.Struct, frozen=True):
    """A job's configuration with its throughput and gain G_ij (Table 1)."""

    job_id: JobId
    config: Configuration
    throughput: float
    gain: float


class PassResult(msgspec.Struct, frozen=True):
    """The pass's choices, in the order of the input jobs."""

    choices: tuple[Choice, ...]
    objective: float
    bound: float
    gap: float
    solve_s: float
    status: str
    formulation: str  # "direct" | "class" | "greedy" | "empty"
    columns: int
