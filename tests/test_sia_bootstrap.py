"""Sia's own throughput model (scheduling/policies/sia/bootstrap.py, Sia
§3.2 and the artifact's fit_perf_params): linear from one-GPU profiles
until measured, fitted where the job ran, projected by the one-GPU ratio
elsewhere; the measurements travel in the plan's state from plan to plan."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.policies.sia.bootstrap import (
    MULTI_NODE_PRIOR,
    STATE,
    Measured,
    Observations,
    StateCodec,
    bootstrapped,
    decode,
    encode,
    fit_type,
    observe,
)
from scheduling.policies.sia.policy import SiaPolicy, SiaSettings
from shared.configuration import Configuration
from shared.ids import GpuType, JobId
from shared.snapshot import JobState, Snapshot
from tests.helpers import cluster, flat_estimate, state

A, B = GpuType("A"), GpuType("B")
C = cluster([("A", 2, 4), ("B", 2, 4)])
EST = flat_estimate("j", {"A": 100.0, "B": 50.0})  # one GPU: A 100/s, B 50/s


def test_without_measurements_every_type_scales_linearly() -> None:
    view = bootstrapped(EST, (), C)
    assert view.by_type[A].agg == (100.0,) * 4 and view.by_type[A].dist == (100.0,)
    assert view.by_type[B].agg == (50.0,) * 4


def test_a_measured_type_fits_and_the_others_borrow_its_scaling() -> None:
    view = bootstrapped(EST, (Measured(A, 2, 1, 80.0),), C)
    assert view.by_type[A].agg[1] == pytest.approx(80.0)
    assert view.by_type[A].agg[3] == pytest.approx(80.0)  # b = 0: nothing above 2 GPUs seen
    assert view.by_type[B].agg[1] == pytest.approx(80.0 * 50.0 / 100.0)  # projected
    sync = 1 / 80.0 - 1 / 100.0
    assert view.by_type[A].dist[0] == pytest.approx(1 / (1 / 100.0 + MULTI_NODE_PRIOR * sync))


def test_sync_grows_with_gpus_once_more_than_two_are_measured() -> None:
    model = fit_type(100.0, (Measured(A, 2, 1, 80.0), Measured(A, 4, 1, 50.0)))
    assert model.per_gpu(2, 1) == pytest.approx(80.0)
    assert model.per_gpu(4, 1) == pytest.approx(50.0)
    assert model.per_gpu(8, 1) < model.per_gpu(4, 1)


@given(st.lists(st.tuples(st.integers(2, 16), st.integers(1, 3),
                          st.floats(1.0, 100.0)), max_size=6))
def test_the_model_never_beats_linear_scaling(points: list[tuple[int, int, float]]) -> None:
    model = fit_type(100.0, (Measured(A, g, k, v) for g, k, v in points))
    assert all(0 < model.per_gpu(g, k) <= 100.0 + 1e-9 for g in range(1, 17) for k in (1, 2))


def running(job: str, parts: dict[str, int], throughput: float) -> JobState:
    return msgspec.structs.replace(state(job, [1, 2, 4]), phase="running",
                                   current=Configuration.of(parts), throughput=throughput)


def test_observe_keeps_the_last_value_per_configuration_and_jobs_out_of_view() -> None:
    snap = Snapshot(now=0.0, cluster=C, jobs=(running("j", {"A-0": 2}, 160.0),))
    obs = observe(Observations({JobId("gone"): (Measured(B, 1, 1, 5.0),)}), snap)
    assert obs.jobs[JobId("j")] == (Measured(A, 2, 1, 80.0),)
    assert JobId("gone") in obs.jobs  # another tenant's view, say
    again = observe(obs, msgspec.structs.replace(snap, jobs=(running("j", {"A-0": 2}, 120.0),)))
    assert again.jobs[JobId("j")] == (Measured(A, 2, 1, 60.0),)
    mixed = msgspec.structs.replace(snap, jobs=(running("m", {"A-0": 1, "B-0": 1}, 10.0),))
    assert JobId("m") not in observe(Observations(), mixed).jobs


def test_the_policy_plans_on_what_it_measured_in_earlier_plans() -> None:
    policy = SiaPolicy()
    first = Snapshot(now=1000.0, cluster=C, jobs=(running("j", {"A-0": 2}, 100.0),),
                     estimates={JobId("j"): EST})
    plan = policy.plan(first)
    [record] = [r for r in plan.reasons.layers if r.name == STATE]
    assert decode(record.state).jobs[JobId("j")] == (Measured(A, 2, 1, 50.0),)
    # The estimator says 95/s per GPU at 2 GPUs; Sia believes its measurement.
    later = msgspec.structs.replace(first, layer_state={STATE: record.state})
    [a] = policy.plan(later).assignments
    per_gpu = a.throughput / a.config.total_gpus
    expected = bootstrapped(EST, (Measured(A, 2, 1, 50.0),), C).by_type[
        C.by_id[a.config.servers[0]].gpu_type].agg_per_gpu(a.config.total_gpus)
    assert per_gpu == pytest.approx(expected) and per_gpu < 95.0
    estimator = SiaPolicy(SiaSettings(throughput="estimator")).plan(later)
    assert all(x.throughput / x.config.total_gpus > 90.0 for x in estimator.assignments)


def test_the_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="throughput"):
        SiaSettings(throughput="oracle")


def test_the_state_codec_reuses_what_it_encoded_and_decodes_anything_else() -> None:
    codec = StateCodec()
    ours = Observations({JobId("a"): (Measured(GpuType("A"), 2, 1, 5.0),)})
    blob = codec.encode(ours)
    assert codec.decode(blob) is ours  # the bytes it just wrote: no decode
    other = Observations({JobId("b"): (Measured(GpuType("B"), 1, 1, 3.0),)})
    # Another state (a failover, another tenant's call) is decoded, not the cached one.
    assert codec.decode(encode(other)) == other
    assert codec.decode(None) == Observations()
