"""CODA's adaptive CPU allocator (§V-B) on Synergy's measured curves."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.cores.allocator import (
    DEFAULT_SETTINGS,
    Climb,
    ClimbSettings,
    begin,
    observe,
    server_cores,
    start_point,
)
from shared.job import Category, CoreHints
from world.cpu_scaling import curve

Speed = Callable[[int], float]


def climb(speed: Speed, start: int, ceiling: int = 24,
          cfg: ClimbSettings = DEFAULT_SETTINGS) -> Climb:
    """Run a climb to the end, measuring ``speed`` at each point it asks for;
    fails if it asks for more than ``max_steps`` samples."""
    state = begin(start, ceiling, cfg)
    for _ in range(cfg.max_steps):
        if state.settled:
            return state
        state = observe(state, speed(state.current), cfg)
    assert state.settled, f"not settled after {cfg.max_steps} samples: {state}"
    return state


def synergy(model: str, gpus: int) -> Speed:
    c = curve(model, gpus)
    return lambda per_gpu: c.speed(per_gpu)


# --- worked examples ------------------------------------------------------------------


def test_resnet50_from_cv_default_climbs_up_to_four() -> None:
    """res50 at 1 GPU: 3 -> 1.0, 2 -> 0.74 (loses), 4 -> 1.15 (gains), 5 -> 1.15
    (no gain): settles on 4 after 4 samples (Table II: 3-4 profiling steps)."""
    result = climb(synergy("res50", 1), start=3)
    assert result.tried() == (3, 2, 4, 5)
    assert result.current == result.best == 4
    assert result.steps == 4
    assert result.best_throughput == pytest.approx(1.15)


def test_deepspeech_from_speech_default_slims_to_three() -> None:
    """deepspeech at 1 GPU is flat from 3 cores: going down from 5 keeps
    helping (same speed, fewer cores) until 2 loses; 4 is known not to gain."""
    start = start_point("speech", CoreHints(), ())
    result = climb(synergy("deepspeech", 1), start)
    assert start == 5
    assert result.tried() == (5, 4, 3, 2)
    assert result.current == 3


def test_a_plateau_stops_the_climb_up_after_one_step() -> None:
    """res50 at 2 GPUs saturates at 3 cores per GPU: up to 4 gains nothing."""
    result = climb(synergy("res50", 2), start=3)
    assert result.tried() == (3, 2, 4)
    assert result.current == 3


def test_a_flat_curve_walks_down_to_the_floor() -> None:
    """bert needs one core: every step down helps until the floor."""
    assert climb(synergy("bert", 1), start=3).tried() == (3, 2, 1)
    floor2 = ClimbSettings(min_per_gpu=2)
    result = climb(synergy("bert", 1), start=3, cfg=floor2)
    assert result.tried() == (3, 2)
    assert result.current == 2


def test_the_ceiling_ends_the_climb_up() -> None:
    """res18 at 1 GPU still gains beyond 6, but the server gives only 6 per GPU."""
    result = climb(synergy("res18", 1), start=6, ceiling=6)
    assert result.tried() == (6, 5)
    assert result.current == 6


def test_max_steps_settles_on_the_best_so_far() -> None:
    """alexnet at 1 GPU keeps gaining up to 12 cores; four samples stop it."""
    cfg = ClimbSettings(max_steps=4)
    result = climb(synergy("alexnet", 1), start=3, cfg=cfg)
    assert result.tried() == (3, 2, 4, 5)
    assert result.current == 5


def test_a_small_fall_within_the_threshold_is_kept_going_down() -> None:
    values = {4: 1.0, 3: 0.985, 2: 0.5}
    result = climb(lambda c: values.get(c, 1.0), start=4)
    assert result.tried() == (4, 3, 2)
    assert result.current == 3
    # A fall just beyond the threshold is a loss: back up, 5 gains nothing.
    values[3] = 0.97
    result = climb(lambda c: values.get(c, 1.0), start=4)
    assert result.tried() == (4, 3, 5)
    assert result.current == 4


def test_a_gain_going_down_raises_the_reference() -> None:
    """Too many cores can slow a job (§V-B, Fig. 3): going down to 3 gains;
    then 2 (3% below 3, 16% above the start) is judged against 3's throughput,
    not the start's, and loses."""
    values = {5: 1.0, 4: 1.1, 3: 1.2, 2: 1.16}
    result = climb(lambda c: values.get(c, 0.1), start=5)
    assert result.tried() == (5, 4, 3, 2)
    assert result.current == 3
    assert result.best_throughput == pytest.approx(1.2)


def test_a_settled_climb_ignores_further_samples() -> None:
    done = climb(synergy("res50", 1), start=3)
    assert observe(done, 99.0) == done


def test_a_climb_survives_a_round_trip_through_json() -> None:
    state = begin(3, 8)
    for t in (1.0, 0.7):
        state = observe(state, t)
    back = msgspec.json.decode(msgspec.json.encode(state), type=Climb)
    assert back == state
    assert observe(back, 1.2) == observe(state, 1.2)


def test_bad_samples_and_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        observe(begin(3, 8), float("nan"))
    with pytest.raises(ValueError):
        observe(begin(3, 8), -1.0)
    with pytest.raises(ValueError):
        begin(3, 0)


def test_begin_clamps_the_start_into_the_bounds() -> None:
    assert begin(9, 6).current == 6
    assert begin(1, 6, ClimbSettings(min_per_gpu=2)).current == 2


def test_a_job_gets_its_per_gpu_cores_for_each_gpu_on_a_server() -> None:
    assert server_cores(3, 4) == 12
    assert server_cores(3, 0) == 0


# --- start points (§V-B-1) ----------------------------------------------------------------


@pytest.mark.parametrize(("category", "expected"),
                         [("cv", 3), ("nlp", 5), ("speech", 5), ("other", 3)])
def test_a_first_job_starts_at_its_category_default(category: Category, expected: int) -> None:
    assert start_point(category, CoreHints(), ()) == expected


def test_the_owner_history_gives_the_largest_earlier_point() -> None:
    assert start_point("cv", CoreHints(), [2, 6, 4]) == 6
    assert start_point("nlp", CoreHints(), [2]) == 2


def test_hints_adjust_the_start() -> None:
    assert start_point("nlp", CoreHints(pipeline=True), ()) == 4
    assert start_point("nlp", CoreHints(pipeline=True, many_weights=True), ()) == 3
    assert start_point("cv", CoreHints(complex_preprocessing=True), [4]) == 5
    both = CoreHints(pipeline=True, complex_preprocessing=True)
    assert start_point("speech", both, ()) == 5


def test_the_start_never_falls_below_the_floor() -> None:
    slim = CoreHints(pipeline=True, many_weights=True)
    assert start_point("cv", slim, [1]) == 1
    assert start_point("cv", slim, [2], ClimbSettings(min_per_gpu=2)) == 2


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        ClimbSettings(threshold=1.0)
    with pytest.raises(ValueError):
        ClimbSettings(max_steps=0)
    with pytest.raises(ValueError):
        ClimbSettings(start_nlp=0)


# --- properties ----------------------------------------------------------------------------

curves = st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False),
                  min_size=24, max_size=24)


@settings(max_examples=400, deadline=None)
@given(values=curves, start=st.integers(-2, 30), floor=st.integers(1, 3),
       ceiling=st.integers(3, 24), steps=st.integers(1, 10),
       threshold=st.sampled_from([0.0, 0.02, 0.1]))
def test_any_curve_settles_in_bounds_within_max_steps(
        values: list[float], start: int, floor: int, ceiling: int, steps: int,
        threshold: float) -> None:
    cfg = ClimbSettings(min_per_gpu=floor, max_steps=steps, threshold=threshold)

    def speed(c: int) -> float:
        return values[c - 1]

    result = climb(speed, start, ceiling, cfg)
    tried = result.tried()
    assert 1 <= result.steps <= steps
    assert len(set(tried)) == len(tried), "a point was measured twice"
    assert all(floor <= c <= ceiling for c in tried)
    assert result.current == result.best
    assert result.current in tried
    # Never settles on a point clearly worse than where it started.
    assert speed(result.current) >= speed(tried[0]) * (1 - threshold) - 1e-12
    # Deterministic: the same measurements give the same climb.
    assert climb(speed, start, ceiling, cfg) == result
