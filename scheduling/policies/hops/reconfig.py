"""What a change of configuration costs a job in Hops' ILP (Eq. 11): the
share of its gain lost to the checkpoint-restart the change takes. This
project's addition; the paper charges nothing (``hops-paper``).

A move that restarts a job costs it ``restart_s`` seconds of progress
(``JobState.restart_s``, the job's own cost). Over a *horizon* of ``H``
seconds in which the new configuration keeps it, the job runs
``1 - restart_s / H`` of the time, so every option that would restart it
weighs that factor less than it would without the restart (the switch
factor of ``PassJob``). Two horizons, by ``HopsSettings.reconfig_horizon``:

* ``"round"``: the round length (§3.6: a plan holds until the next round's
  first plan). Myopic: a job whose restart takes most of a round (an
  ImageNet model's 250 s of 300 s) is then never grown onto idle GPUs,
  however long it has left;
* ``"remaining"`` (the default): the job's remaining time at its current
  speed (a queued job: at its best estimated speed), at least a round, as
  a configuration that persists pays for its restart over the rest of the
  job.
"""

from __future__ import annotations

from shared.cluster import Cluster
from shared.estimate import JobEstimate, config_throughput
from shared.snapshot import JobState

HORIZONS = ("remaining", "round")


def best_rate(est: JobEstimate, requirements: tuple[int, ...]) -> float:
    """The fastest a job could run on one server of any type, samples/s."""
    return max((c.agg_per_gpu(min(g, len(c.agg))) * min(g, len(c.agg))
                for c in est.by_type.values() if c.agg for g in requirements), default=0.0)


def horizon(job: JobState, est: JobEstimate, cluster: Cluster, round_s: float,
            requirements: tuple[int, ...]) -> float:
    """Seconds the job's next configuration is expected to hold: its
    remaining time at its current (or best) speed, at least ``round_s``."""
    rate = (config_throughput(est, cluster, job.current) if job.current is not None
            else best_rate(est, requirements))
    return max(round_s, job.remaining_samples / rate) if rate > 0 else round_s


def reconfig_cost(restart_s: float, horizon_s: float) -> float:
    """The share of the horizon a restart takes, at most 1."""
    return min(1.0, restart_s / horizon_s) if horizon_s > 0 else 1.0
