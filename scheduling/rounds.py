"""The round length and the checkpoint-restart cost: one definition each, for
the simulator, the live scheduler and the policies' restart penalties."""

from __future__ import annotations

# Hops §3.6: a first plan every round of 5 minutes.
ROUND_S = 300.0
# Seconds a checkpoint-restart costs a job (Sia's S_i, the simulator's pause).
RESTART_S = 30.0
