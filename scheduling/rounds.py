"""The round length and the checkpoint-restart cost: one definition each, for
the simulator, the live scheduler and the policies' restart penalties."""

from __future__ import annotations

from shared.snapshot import JobState

# Hops §3.6: a first plan every round of 5 minutes.
ROUND_S = 300.0
# Seconds a checkpoint-restart costs a job whose own cost is not known
# (Sia's S_i, Hops' reconfiguration cost, the simulator's pause).
RESTART_S = 30.0


def restart_cost(job: JobState) -> float:
    """What one checkpoint-restart costs ``job``: what the mechanism knows
    (``JobState.restart_s``; the simulator's per-model costs), else
    :data:`RESTART_S`."""
    return job.restart_s if job.restart_s > 0 else RESTART_S
