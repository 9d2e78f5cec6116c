"""The simulator's settings (:class:`SimSettings`), read by the engine
(:mod:`simulator.engine`) and its measuring side (:mod:`simulator.measuring`)."""

from __future__ import annotations

import msgspec

from estimation.estimator import EstimatorSettings
from scheduling.rounds import ROUND_S
from shared import jobenv
from shared.job import R_NUM


class SimSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``round_s``: round length; ``restart_s``: checkpoint-restart cost of
    any (re)start, None: each model's own (:mod:`world.restarts`, Sia's
    measured penalties), which the policies see as ``JobState.restart_s``;
    iterations per profiling run and per running sample;
    ``r_num``: the policy's R_num (§2.2), which turns a job's GPU bounds into
    the requirement set that its plans must come from and its Eq. (9) age
    averages over (the policy spec's ``r_num``, as the live scheduler reads
    it); ``profile_reuse``: jobs of one profile signature share profiles
    (:mod:`shared.reuse`; the policy spec's ``profile_reuse``, off unless
    asked for, as for the baselines)."""

    round_s: float = ROUND_S
    restart_s: float | None = None
    r_num: int = R_NUM
    # Plans later in a round (§3.6) run at most this long after the release or
    # arrival that calls for them, so the events in between share one plan;
    # the paper refreshes its queue every 30 s. 0 plans at every event.
    fill_delay_s: float = 30.0
    profile_iters: int = jobenv.DEFAULT_PROFILE_ITERS
    sample_iters: int = 50
    seed: int = 0
    raqlr_window_h: float = 1.0
    max_time_s: float = 90 * 86400.0
    estimator: EstimatorSettings = EstimatorSettings()
    profile_reuse: bool = False
    # Forecast the queue at each round's first plan and record each waiting
    # job's forecast with what happened (simulator.forecasting); off by
    # default, so runs and their times are as without it.
    forecast: bool = False
    forecast_draws: int = 8
    forecast_preempt: bool = False  # scheduling.forecast.forecast's preempt
    forecast_arrivals: bool = True  # and its arrivals
