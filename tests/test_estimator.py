"""The multi-layer database (§3.3) and the top-down estimator (§3.5)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from estimation.database import DatabaseState, ThroughputDatabase
from estimation.estimator import (
    EstimatorSettings,
    estimate_job,
    modelled_per_gpu_throughput,
    predict,
    round_sig,
    theoretical_per_gpu,
)
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import age, job_sensitivity, sensitivity
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import Pattern, ProfileReport, ThroughputSample, TimeModules

A, B = GpuType("A"), GpuType("B")
A0, A1, A2, B0, B1 = (ServerId(s) for s in ("a0", "a1", "a2", "b0", "b1"))

# Type A: 3 servers x 4 GPUs, B_link 1e10, B_net 1e9 params/s.
# Type B: 2 servers x 2 GPUs, B_link 5e9, B_net 2.5e8 params/s.
CLUSTER = Cluster(
    gpu_types=(GpuTypeSpec(A, 1e10, 1e9), GpuTypeSpec(B, 5e9, 2.5e8)),
    servers=(
        Server(A0, A, 4), Server(A1, A, 4), Server(A2, A, 4),
        Server(B0, B, 2), Server(B1, B, 2),
    ),
)
JOB = JobSpec(
    id=JobId("job"), model="m", batch_size=32, params=110_000_000,
    total_samples=1_200_000, requirements=(1, 2, 4),
)
# Stable data loading (no t_d samples → T_d = T_w = 0), pattern 2.
MODULES = {
    A: TimeModules(t_f=0.02, t_b=0.03, t_u=0.03, pattern=2),
    B: TimeModules(t_f=0.03, t_b=0.10, t_u=0.03, pattern=2),
}


def profiled_db(*types: GpuType) -> ThroughputDatabase:
    db = ThroughputDatabase()
    for t in types or (A, B):
        server = A0 if t == A else B0
        db.record_profile(ProfileReport(JOB.id, t, server, MODULES[t]))
    return db


def agg_sample(server: ServerId, tput: float, gpus: int = 1) -> ThroughputSample:
    return ThroughputSample(JOB.id, server, A, gpus, 1, gpus, tput)


def dist_sample(server: ServerId, tput: float) -> ThroughputSample:
    return ThroughputSample(JOB.id, server, A, local_gpus=2, nodes=2, total_gpus=4,
                            per_gpu_throughput=tput)


def test_theoretical_layer_only_gives_formula_values() -> None:
    est = estimate_job(profiled_db(), JOB, CLUSTER)
    a = est.by_type[A]
    # 1 GPU: T_c=0; T = 0 + max(0.03, 0) + 0.03 + 0.02 = 0.08 → 32/0.08 = 400
    assert a.agg[0] == 400.0
    # 2 GPUs: T_c = 1.1e8/1e10 * 1/2 = 0.0055; max(0.03+0.0011, 0.0055) = 0.0311
    #   T = 0.0311 + 0.05 = 0.0811 → 394.57 → 394.6 (4 significant digits)
    assert a.agg[1] == 394.6
    assert len(a.agg) == 4  # k = 1..4 GPUs per A server
    # n nodes: T_c = 1.1e8/1e9 = 0.11; max(0.052, 0.11) = 0.11; T = 0.16 → 200
    assert a.dist == (200.0, 200.0)  # n = 2..3 servers of type A
    # B: 1 GPU T = 0.1 + 0.03 + 0.03 = 0.16 → 200; 2 nodes: T_c = 0.44,
    #   max(0.1 + 0.088, 0.44) = 0.44; T = 0.5 → 64
    assert est.by_type[B].agg[0] == 200.0
    assert est.by_type[B].dist == (64.0,)
    assert est.by_server == {}


def test_unprofiled_type_is_omitted() -> None:
    est = estimate_job(profiled_db(A), JOB, CLUSTER)
    assert set(est.by_type) == {A}
    with pytest.raises(LookupError):
        predict(profiled_db(A), JOB, CLUSTER, Configuration.of({B0: 1}))


def test_type_layer_overrides_formula() -> None:
    db = profiled_db()
    db.record_sample(agg_sample(A0, 380.0))
    est = estimate_job(db, JOB, CLUSTER)
    assert est.by_type[A].agg[0] == 380.0
    assert est.by_type[A].agg[1] == 394.6  # no sample for 2 GPUs: still the formula
    assert est.by_server == {}  # one sample is too few for the entity layer


def test_entity_layer_gives_curve_for_differing_server_only() -> None:
    db = profiled_db()
    db.record_sample(agg_sample(A0, 380.0))
    for _ in range(3):
        db.record_sample(agg_sample(A1, 300.0))
    est = estimate_job(db, JOB, CLUSTER)
    # Type layer: (380 + 3*300)/4 = 320; a1 at 300 is 6.25% below → own curve.
    assert est.by_type[A].agg[0] == 320.0
    assert set(est.by_server) == {A1}
    own = est.by_server[A1]
    assert own.agg[0] == 300.0
    assert own.agg[1:] == est.by_type[A].agg[1:]
    assert own.dist == est.by_type[A].dist


def test_server_matching_type_within_threshold_gets_no_curve() -> None:
    db = profiled_db()
    for _ in range(3):
        db.record_sample(agg_sample(A0, 400.0))
        db.record_sample(agg_sample(A1, 404.0))
    est = estimate_job(db, JOB, CLUSTER)
    # type mean 402; 400 and 404 are both 0.5% away, under the 3% threshold
    assert est.by_type[A].agg[0] == 402.0
    assert est.by_server == {}


def test_threshold_and_min_count_are_configurable() -> None:
    db = profiled_db()
    db.record_sample(agg_sample(A0, 400.0))
    db.record_sample(agg_sample(A1, 420.0))
    loose = EstimatorSettings(min_entity_samples=1, server_rel_threshold=0.01)
    est = estimate_job(db, JOB, CLUSTER, loose)
    assert est.by_server[A0].agg[0] == 400.0
    assert est.by_server[A1].agg[0] == 420.0


def test_config_throughput_is_slowest_per_gpu_times_total() -> None:
    db = profiled_db()
    for _ in range(3):
        db.record_sample(dist_sample(A0, 200.0))
        db.record_sample(dist_sample(A1, 150.0))
    # a0 → 200, a1 → 150 per GPU on 2 nodes: min(200, 150) * (2 + 2) = 600
    assert predict(db, JOB, CLUSTER, Configuration.of({A0: 2, A1: 2})) == 600.0
    # Across types, theory only: A dist(2) = 200, B dist(2) = 64 → 64 * 2 = 128
    fresh = profiled_db()
    assert predict(fresh, JOB, CLUSTER, Configuration.of({A0: 1, B0: 1})) == 128.0
    # Aggregated: 2 GPUs on a0 → 394.6 * 2
    assert predict(fresh, JOB, CLUSTER, Configuration.of({A0: 2})) == pytest.approx(789.2)


def test_sensitivity_and_age_on_two_types() -> None:
    est = estimate_job(profiled_db(), JOB, CLUSTER)
    # Eq. (10): A: 400/200 = 2; B: 200/64 = 3.125
    assert sensitivity(est, A) == pytest.approx(2.0)
    assert sensitivity(est, B) == pytest.approx(3.125)
    # GPU shares: A 12/16 = 0.75, B 4/16 = 0.25 → 0.75*2 + 0.25*3.125 = 2.28125
    assert job_sensitivity(est, CLUSTER) == pytest.approx(2.28125)
    # Eq. (9) with R_avg = 4: A 1.2e6/(400*4) = 750 s, B 1.2e6/(200*4) = 1500 s
    #   → 0.75*750 + 0.25*1500 = 937.5 s
    assert age(est, CLUSTER, JOB.total_samples, 4.0) == pytest.approx(937.5)


def test_state_round_trip_and_forget() -> None:
    db = profiled_db()
    db.record_sample(ThroughputSample(JOB.id, A0, A, 1, 1, 1, 390.0, (0.01, 0.02), (0.0, 0.001)))
    for _ in range(3):
        db.record_sample(dist_sample(A1, 150.0))
    blob = msgspec.json.encode(db.to_state())
    rebuilt = ThroughputDatabase.from_state(msgspec.json.decode(blob, type=DatabaseState))
    assert rebuilt.to_state() == db.to_state()
    assert estimate_job(rebuilt, JOB, CLUSTER) == estimate_job(db, JOB, CLUSTER)
    db.forget(JOB.id)
    assert estimate_job(db, JOB, CLUSTER).by_type == {}


def test_round_sig() -> None:
    assert round_sig(394.5745, 4) == 394.6
    assert round_sig(0.000123456, 4) == 0.0001235
    assert round_sig(0.0, 4) == 0.0


# --- estimates improve as samples accumulate (§3.5, Figure 7b) -------------

P_CACHE, T_F, T_B, T_U = 0.6, 0.05, 0.10, 0.01


def draw(rng: np.random.Generator, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Paired (T_d, T_w) from the known Eq. (3) source: hits ~ N(0.01, 0.002)
    with waits ~ N(0.04, 0.004); misses ~ N(0.2, 0.02) with waits ~ N(0.005, 0.001)."""
    n = hit.size
    t_d = np.where(hit, rng.normal(0.01, 0.002, n), rng.normal(0.2, 0.02, n))
    t_w = np.where(hit, rng.normal(0.04, 0.004, n), rng.normal(0.005, 0.001, n))
    return np.clip(t_d, 0.0, None), np.clip(t_w, 0.0, None)


def true_throughput(pattern: Pattern) -> float:
    """batch / E[T_iter] on one GPU (T_c = 0), by Monte Carlo over the source."""
    rng = np.random.default_rng(12345)
    t_d, t_w = draw(rng, rng.random(2_000_000) < P_CACHE)
    # Eq. (1) per iteration with T_c = 0, written out independently of the code.
    overlapped = np.maximum(t_d, T_B + T_U) if pattern == 1 else t_d + T_B + T_U
    t_iter = overlapped + T_F + t_w
    return JOB.batch_size / float(t_iter.mean())


def profile_skewed(rng: np.random.Generator, pattern: Pattern) -> ThroughputDatabase:
    """A 10-iteration profile in which cache hits are over-represented (9 of 10)."""
    t_d, t_w = draw(rng, np.array([True] * 9 + [False]))
    modules = TimeModules(T_F, T_B, T_U, pattern, tuple(t_d.tolist()), tuple(t_w.tolist()))
    db = ThroughputDatabase()
    db.record_profile(ProfileReport(JOB.id, A, A0, modules))
    return db


@pytest.mark.parametrize("pattern", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimates_improve_with_running_mode_data_times(pattern: Pattern, seed: int) -> None:
    truth = true_throughput(pattern)
    rng = np.random.default_rng(seed)
    db = profile_skewed(rng, pattern)
    one_gpu = Configuration.of({A0: 1})

    def error() -> float:
        return abs(predict(db, JOB, CLUSTER, one_gpu) - truth) / truth

    errors = [error()]
    for _ in range(30):  # 30 running-mode reports of 100 iterations each
        t_d, t_w = draw(rng, rng.random(100) < P_CACHE)
        db.record_sample(ThroughputSample(JOB.id, A0, A, data_times=tuple(t_d.tolist()),
                                          wait_times=tuple(t_w.tolist())))
        errors.append(error())
    assert errors[0] > 0.05  # the skewed profile misleads the formula at first
    assert errors[5] < errors[0]
    assert errors[5] < 0.03  # after 500 running-mode iterations
    assert errors[-1] < 0.015  # after 3000


def test_estimates_improve_with_measured_throughput() -> None:
    truth = true_throughput(2)
    rng = np.random.default_rng(4)
    db = profile_skewed(rng, 2)
    one_gpu = Configuration.of({A0: 1})
    initial = abs(predict(db, JOB, CLUSTER, one_gpu) - truth) / truth
    for _ in range(100):  # noisy (2%) per-GPU throughput measurements
        db.record_sample(agg_sample(A0, truth * (1 + rng.normal(0, 0.02))))
    final = abs(predict(db, JOB, CLUSTER, one_gpu) - truth) / truth
    assert final < initial
    assert final < 0.01


def test_formula_values_are_reused_until_the_fit_changes() -> None:
    db = profiled_db(A)
    rec = db.record(JOB.id, A)
    assert rec is not None
    theory, spec = rec.theory, CLUSTER.gpu_types[0]

    def fresh(gpus: int, nodes: int) -> float:
        assert theory.modules is not None
        return modelled_per_gpu_throughput(theory.modules, theory.samples.model(),
                                           JOB.batch_size, JOB.params, spec, gpus, nodes)

    first = estimate_job(db, JOB, CLUSTER)
    assert theory.memo and theory.memo_basis is not None
    assert estimate_job(db, JOB, CLUSTER) == first
    assert theoretical_per_gpu(theory, JOB, spec, 2, 1) == fresh(2, 1)
    # New data times refit Eq. (3): the memo must follow the new model.
    rng = np.random.default_rng(0)
    db.record_sample(ThroughputSample(JOB.id, A0, A, 1, 1, 1, 0.0,
                                      tuple(rng.normal(0.08, 0.01, 64).clip(0.0))))
    assert theoretical_per_gpu(theory, JOB, spec, 2, 1) == fresh(2, 1)
    assert theoretical_per_gpu(theory, JOB, spec, 3, 3) == fresh(3, 3)
    assert estimate_job(db, JOB, CLUSTER) != first
    # A new profile replaces the modules, which also invalidates the memo.
    db.record_profile(ProfileReport(JOB.id, A, A0, MODULES[B]))
    assert theoretical_per_gpu(theory, JOB, spec, 2, 1) == fresh(2, 1)


def test_curves_are_reused_per_type_until_that_type_gets_a_report() -> None:
    db = profiled_db()
    first = estimate_job(db, JOB, CLUSTER)
    b_curve = first.by_type[B]
    # A sample on type A changes A's curve; B's curve object is reused as is.
    db.record_sample(agg_sample(A0, 380.0))
    second = estimate_job(db, JOB, CLUSTER)
    assert second.by_type[A].agg[0] == 380.0 != first.by_type[A].agg[0]
    assert second.by_type[B] is b_curve
    # Every report invalidates its record, even when the value it adds is the
    # same: the memo never serves a curve that misses a report.
    db.record_sample(agg_sample(A1, 300.0))
    assert estimate_job(db, JOB, CLUSTER).by_type[A].agg[0] == 340.0
    # Another cluster (fewer type-A servers) is not served from the memo.
    small = Cluster(gpu_types=CLUSTER.gpu_types, servers=CLUSTER.servers[:1] + CLUSTER.servers[3:])
    assert len(estimate_job(db, JOB, small).by_type[A].dist) == 0
