"""The prior-weighted ILP (Hops §3.6, Eq. 11-13): the MIP layer, Table 1 as
a worked example, and properties of a planning pass."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.ilp import INF, MipModel, MipOptions, solve_mip
from scheduling.policies.hops.formulation import assignment_model
from scheduling.policies.hops.passes import (
    PassJob,
    PassResult,
    SolverSettings,
    greedy_pass,
    scaled_weights,
    solve_pass,
)
from scheduling.policies.hops.proof import settled
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve, sensitivity
from shared.ids import GpuType, JobId, ServerId

A = GpuType("A")
EXACT = SolverSettings(mip_rel_gap=0.0, accept_gap=0.0)


# -- MIP layer -----------------------------------------------------------------


def knapsack() -> MipModel:
    model = MipModel()
    row = model.add_row(-INF, 10.0)
    for value, weight in ((10.0, 5.0), (7.0, 4.0), (6.0, 3.0), (3.0, 3.0)):
        model.add_col(value, 0.0, 1.0, integer=True, rows=[row], values=[weight])
    return model


def test_solve_mip_knapsack_with_incumbent() -> None:
    model = knapsack()
    start = [0.0, 0.0, 1.0, 1.0]
    assert model.objective(start) == pytest.approx(9.0)
    result = solve_mip(model, MipOptions(mip_rel_gap=0.0), incumbent=start)
    assert result.status == "Optimal"
    assert result.has_solution
    assert result.objective == pytest.approx(17.0)  # items 1 and 2: weight 9
    assert list(result.values.round()) == [1.0, 1.0, 0.0, 0.0]
    assert result.bound == pytest.approx(17.0)
    assert model.objective(result.values) == pytest.approx(17.0)


def test_fixed_to_zero_bars_columns_and_keeps_the_numbering() -> None:
    model = knapsack()
    barred = model.fixed_to_zero(np.array([0]))
    assert (barred.num_rows, barred.num_cols) == (model.num_rows, model.num_cols)
    result = solve_mip(barred, MipOptions(mip_rel_gap=0.0))
    assert result.objective == pytest.approx(16.0)  # items 2, 3 and 4: weight 10
    assert list(result.values.round()) == [0.0, 1.0, 1.0, 1.0]
    # The original is untouched.
    assert solve_mip(model, MipOptions(mip_rel_gap=0.0)).objective == pytest.approx(17.0)


def test_solve_mip_time_limit_keeps_incumbent() -> None:
    model = knapsack()
    result = solve_mip(model, MipOptions(time_limit_s=1e-9), incumbent=[0.0, 0.0, 1.0, 1.0])
    assert result.has_solution
    assert result.objective >= 9.0 - 1e-9


def test_assignment_model_rows() -> None:
    model = assignment_model(
        jobs=[0, 0, 1],
        coeffs=[1.0, 2.0, 3.0],
        usage=[{"s": 4.0}, {"s": 8.0}, {"s": 4.0}],
        capacity={"s": 8.0},
    )
    assert (model.num_rows, model.num_cols) == (3, 3)
    # Without (12) job 0 would take both options (11); without (13) all three (6).
    result = solve_mip(model, MipOptions(mip_rel_gap=0.0))
    assert result.objective == pytest.approx(4.0)
    assert list(result.values.round()) == [1.0, 0.0, 1.0]


def test_mip_builder_rejects_bad_input() -> None:
    model = MipModel()
    with pytest.raises(ValueError):
        model.add_row(2.0, 1.0)
    with pytest.raises(ValueError):
        model.add_col(1.0, 0.0, 1.0, integer=True, rows=[0], values=[1.0])


# -- Table 1 -------------------------------------------------------------------
#
# One 8-GPU server. The columns of Table 1 are matched to GPU counts as follows
# (aggregated configurations {s0: R_k}):
#   job 1: config 1, 2, 3 = 1, 2, 4 GPUs           G = 1, 1.8, 2.6
#   job 2: config 1, 2, 3, 4 = 2, 1, 4, 8 GPUs     G = 2, 1, 3, 4.1
#   job 3: config 1, 2, 3 = 2, 4, 1 GPUs           G = 1.2, 1.6, 1
#   job 4: config 1, 2, 3 = 1, 2, 4 GPUs           G = 1, 1.8, 3.2
# Each job's 1-GPU throughput is 1, so G is the throughput itself.

TABLE1: dict[str, dict[int, float]] = {
    "j1": {1: 1.0, 2: 1.8, 4: 2.6},
    "j2": {1: 1.0, 2: 2.0, 4: 3.0, 8: 4.1},
    "j3": {1: 1.0, 2: 1.2, 4: 1.6},
    "j4": {1: 1.0, 2: 1.8, 4: 3.2},
}
SERVER = ServerId("s0")
ONE_SERVER = Cluster((GpuTypeSpec(A, 1e9, 1e8),), (Server(SERVER, A, 8),))


def table1_jobs(weights: Sequence[float]) -> list[PassJob]:
    jobs = []
    for (name, gains), weight in zip(TABLE1.items(), weights, strict=True):
        agg = [0.0] * 8
        for gpus, tput in gains.items():
            agg[gpus - 1] = tput / gpus
        est = JobEstimate(JobId(name), {A: ThroughputCurve(tuple(agg), (0.1,))})
        jobs.append(PassJob(JobId(name), weight, tuple(sorted(gains)), {A: 2.0}, est))
    return jobs


def brute_force(weights: Sequence[float]) -> tuple[float, list[dict[str, int]]]:
    """Best Eq. (11) value over every selection, and all selections reaching it."""
    options = [[None, *gains] for gains in TABLE1.values()]
    scored = []
    for pick in itertools.product(*options):
        if sum(g or 0 for g in pick) > 8:
            continue
        chosen = {n: g for n, g in zip(TABLE1, pick, strict=True) if g}
        value = sum(w * TABLE1[n][chosen[n]] for w, n in zip(weights, TABLE1, strict=True)
                    if n in chosen)
        scored.append((round(value, 9), chosen))
    best = max(v for v, _ in scored)
    return best, [sel for v, sel in scored if v == best]


def selection(result: PassResult) -> dict[str, int]:
    return {c.job_id: c.config.total_gpus for c in result.choices}


def test_table1_gain_matrix() -> None:
    result = solve_pass(ONE_SERVER, {SERVER: 8}, table1_jobs([1, 1, 1, 1]), EXACT)
    for c in result.choices:
        assert c.gain == pytest.approx(TABLE1[c.job_id][c.config.total_gpus])
        assert c.config == Configuration.of({SERVER: c.config.total_gpus})


def test_table1_lambda_0_maximises_throughput_gain() -> None:
    # By hand: every job on 1 GPU is G = 4 with 4 GPUs spare; the best use of
    # them is job 4 to 4 GPUs (+2.2 for 3) and job 2 to 2 GPUs (+1 for 1): 7.2.
    expected = {"j1": 1, "j2": 2, "j3": 1, "j4": 4}
    assert brute_force([1, 1, 1, 1]) == (pytest.approx(7.2), [expected])
    for direct_max in (20000, 0):
        s = SolverSettings(mip_rel_gap=0.0, accept_gap=0.0, direct_max_columns=direct_max)
        result = solve_pass(ONE_SERVER, {SERVER: 8}, table1_jobs([1, 1, 1, 1]), s)
        assert selection(result) == expected
        assert result.objective == pytest.approx(7.2)
    assert result.formulation == "class"


def test_table1_lambda_1() -> None:
    # Priorities 4, 3, 2, 1 tie two plans at 19.4 ({j1:4, j2:4} and {j1:4, j2:2,
    # j3:1, j4:1}); with 1.5 for job 4 the second wins, 19.9 = 4*2.6 + 3*2 +
    # 2*1 + 1.5*1, against 19.7 for {j1:2, j2:4, j3:1, j4:1}.
    best, ties = brute_force([4, 3, 2, 1])
    assert best == pytest.approx(19.4) and len(ties) == 2
    expected = {"j1": 4, "j2": 2, "j3": 1, "j4": 1}
    assert brute_force([4, 3, 2, 1.5]) == (pytest.approx(19.9), [expected])
    result = solve_pass(ONE_SERVER, {SERVER: 8}, table1_jobs([4, 3, 2, 1.5]), EXACT)
    assert selection(result) == expected
    assert result.objective == pytest.approx(19.9 / 4)  # weights scaled by the largest


def test_table1_large_lambda_is_greedy() -> None:
    weights = [p**12 for p in (4, 3, 2, 1)]
    jobs = table1_jobs(weights)
    greedy = greedy_pass(ONE_SERVER, {SERVER: 8}, jobs, EXACT)
    # Greedy by priority: job 1 takes its best (4 GPUs), job 2 its best that
    # fits (4 GPUs), nothing is left for jobs 3 and 4.
    assert selection(greedy) == {"j1": 4, "j2": 4}
    assert greedy.formulation == "greedy"
    exact = solve_pass(ONE_SERVER, {SERVER: 8}, jobs, EXACT)
    assert selection(exact) == selection(greedy)
    assert solve_pass(ONE_SERVER, {SERVER: 8}, jobs, SolverSettings(greedy=True)) == greedy


# -- pass behaviour ------------------------------------------------------------


def flat_job(name: str, weight: float, reqs: tuple[int, ...], rho: float = 2.0) -> PassJob:
    curve = ThroughputCurve(tuple(10.0 - 0.5 * k for k in range(8)), (10.0 / rho,) * 3)
    est = JobEstimate(JobId(name), {A: curve})
    return PassJob(JobId(name), weight, reqs, {A: rho}, est)


def test_tiny_weights_still_take_leftovers() -> None:
    jobs = [flat_job("big", 1.0, (4,)), flat_job("tiny", 1e-30, (4,)), flat_job("z", 0.0, (1,))]
    assert scaled_weights(jobs) == [1.0, 1e-9, 1e-9]
    for direct_max in (20000, 0):
        s = SolverSettings(direct_max_columns=direct_max)
        result = solve_pass(ONE_SERVER, {SERVER: 8}, jobs[:2], s)
        assert selection(result) == {"big": 4, "tiny": 4}


def test_invalid_input_rejected() -> None:
    with pytest.raises(ValueError):
        solve_pass(ONE_SERVER, {SERVER: 8}, [flat_job("a", -1.0, (1,))])
    with pytest.raises(ValueError):
        solve_pass(ONE_SERVER, {SERVER: 8}, [flat_job("a", 1.0, (1,))] * 2)


def test_empty_pass() -> None:
    assert solve_pass(ONE_SERVER, {SERVER: 0}, [flat_job("a", 1.0, (1,))]).formulation == "empty"
    assert solve_pass(ONE_SERVER, {SERVER: 8}, []).choices == ()


def test_class_mode_realises_distributed_jobs() -> None:
    servers = tuple(Server(ServerId(f"s{i}"), A, 8) for i in range(5))
    cluster = Cluster((GpuTypeSpec(A, 1e9, 1e8),), servers)
    jobs = [flat_job("d1", 2.0, (16,), rho=1.2), flat_job("d2", 1.0, (12,), rho=1.2),
            flat_job("a", 1.0, (4,))]
    free = {s.id: 8 for s in servers}
    exact_class = SolverSettings(mip_rel_gap=0, accept_gap=0.0, direct_max_columns=0)
    result = solve_pass(cluster, free, jobs, exact_class)
    assert result.formulation == "class"
    configs = {c.job_id: c.config for c in result.choices}
    assert configs["d1"] == Configuration.of({"s0": 8, "s1": 8})
    assert configs["d2"] == Configuration.of({"s2": 8, "s3": 4})
    assert configs["a"] == Configuration.of({"s3": 4})


def test_time_limit_returns_a_feasible_plan() -> None:
    servers = tuple(Server(ServerId(f"s{i:02d}"), A, 8) for i in range(16))
    cluster = Cluster((GpuTypeSpec(A, 1e9, 1e8),), servers)
    free = {s.id: 8 for s in servers}
    jobs = [flat_job(f"j{i}", 1.0 + i % 7, ((1, 2, 4), (2, 8), (4, 12, 16))[i % 3],
                     rho=(1.2, 2.0)[i % 2]) for i in range(40)]
    for direct_max in (20000, 0):
        s = SolverSettings(time_limit_s=1e-4, direct_max_columns=direct_max)
        result = solve_pass(cluster, free, jobs, s)
        check_plan(free, jobs, result)
        assert sum(c.config.total_gpus for c in result.choices) == 128


def test_start_near_the_lp_bound_settles_the_pass_without_branch_and_bound() -> None:
    s = SolverSettings(mip_rel_gap=0.01, accept_gap=0.05)
    assert settled(99.5, 100.0, s, large=False) == "Optimal"  # within mip_rel_gap
    assert settled(98.0, 100.0, s, large=True) == "Accepted"  # within accept_gap
    assert settled(98.0, 100.0, s, large=False) is None  # small passes search on
    assert settled(90.0, 100.0, s, large=True) is None  # 10% below: B&B runs
    # No start (objective 0) or no bound: B&B runs.
    assert settled(0.0, 100.0, s, large=True) is None
    assert settled(98.0, float("inf"), s, large=True) is None
    # accept_gap below mip_rel_gap: only the solver's own gap settles.
    exact = msgspec.structs.replace(s, accept_gap=0.0)
    assert settled(99.5, 100.0, exact, large=True) == "Optimal"
    assert settled(98.0, 100.0, exact, large=True) is None


def subset_sum(n: int = 40) -> MipModel:
    """A subset-sum knapsack: its LP bound is weak and cuts do not close it,
    so branch and bound has to search."""
    weights = [100_003 + 7_919 * ((i * 37) % 97) + 13 * i * i for i in range(n)]
    model = MipModel()
    row = model.add_row(-INF, sum(weights) // 2 + 0.5)
    for w in weights:
        model.add_col(float(w), 0.0, 1.0, integer=True, rows=[row], values=[float(w)])
    return model


def test_node_limit_ends_the_search_at_the_same_point_every_time() -> None:
    model = subset_sum()
    options = MipOptions(mip_rel_gap=0.0, time_limit_s=30.0, presolve=False, max_nodes=1)
    first = solve_mip(model, options, incumbent=[0.0] * model.num_cols)
    again = solve_mip(model, options, incumbent=[0.0] * model.num_cols)
    assert first.status == "Solution limit reached"  # HiGHS's name for its node limit
    assert first.solve_s < 30.0
    assert first.has_solution and first.objective > 0
    assert list(first.values) == list(again.values)


def test_current_configuration_warm_start_keeps_optimum() -> None:
    jobs = table1_jobs([1, 1, 1, 1])
    warm = [
        PassJob(j.job_id, j.weight, j.requirements, j.rho, j.estimate,
                Configuration.of({SERVER: j.requirements[-1] if i == 0 else 1}))
        for i, j in enumerate(jobs)
    ]
    for direct_max in (20000, 0):
        s = SolverSettings(mip_rel_gap=0.0, accept_gap=0.0, direct_max_columns=direct_max)
        result = solve_pass(ONE_SERVER, {SERVER: 8}, warm, s)
        assert result.objective == pytest.approx(7.2)


# -- properties ----------------------------------------------------------------


def _curve(draw: st.DrawFn) -> ThroughputCurve:
    base = draw(st.floats(1.0, 100.0))
    eff = draw(st.floats(0.6, 1.0))
    agg = tuple(round(base * eff ** k.bit_length(), 3) for k in range(8))
    dist = tuple(round(base / draw(st.floats(1.0, 3.0)), 3) for _ in range(3))
    return ThroughputCurve(agg, dist if draw(st.booleans()) or True else ())


@st.composite
def instances(
    draw: st.DrawFn, uniform: bool = False
) -> tuple[Cluster, dict[ServerId, int], list[PassJob]]:
    """Small clusters (1-2 types, 1-4 servers each) and 1-5 jobs. ``uniform``:
    every server of a type has the same idle GPUs (2, 4 or 8) and only
    type-level curves, so each type is one class; there the class and the
    direct formulations describe the same plans."""
    types = [GpuType(t) for t in draw(st.sampled_from([["A"], ["A", "B"]]))]
    servers, free = [], {}
    for t in types:
        idle = draw(st.sampled_from([2, 4, 8]))
        for k in range(draw(st.integers(1, 4))):
            sid = ServerId(f"{t}{k}")
            servers.append(Server(sid, t, 8))
            free[sid] = idle if uniform else draw(st.integers(0, 8))
    if not uniform:
        servers = draw(st.permutations(servers))
    cluster = Cluster(tuple(GpuTypeSpec(t, 1e9, 1e8) for t in types), tuple(servers))
    sizes = [1, 2, 3, 4, 6, 8, 12, 16]
    jobs = []
    for i in range(draw(st.integers(1, 5))):
        jid = JobId(f"j{i}")
        by_type = {t: _curve(draw) for t in types}
        by_server = {} if uniform else {
            s.id: _curve(draw) for s in servers if draw(st.integers(0, 5)) == 0
        }
        est = JobEstimate(jid, by_type, by_server)
        reqs = tuple(sorted(draw(st.sets(st.sampled_from(sizes), min_size=1, max_size=4))))
        weight = draw(st.floats(0.05, 10.0))
        jobs.append(PassJob(jid, weight, reqs, {t: sensitivity(est, t) for t in types}, est))
    return cluster, free, jobs


def check_plan(
    free: Mapping[ServerId, int], jobs: Sequence[PassJob], result: PassResult
) -> None:
    used: Counter[ServerId] = Counter()
    for c in result.choices:
        for sid, gpus in c.config.parts:
            used[sid] += gpus
    assert all(used[s] <= free.get(s, 0) for s in used), "server over-allocated"
    ids = [c.job_id for c in result.choices]
    assert len(ids) == len(set(ids)), "a job got two configurations"
    reqs = {j.job_id: j.requirements for j in jobs}
    assert all(c.config.total_gpus in reqs[c.job_id] for c in result.choices)
    assert all(c.gain >= 1.0 - 1e-9 and c.throughput > 0 for c in result.choices)


@given(instances(), st.sampled_from([20000, 0]))
@settings(max_examples=60, deadline=None)
def test_pass_invariants_and_determinism(
    inst: tuple[Cluster, dict[ServerId, int], list[PassJob]], direct_max: int
) -> None:
    cluster, free, jobs = inst
    s = SolverSettings(direct_max_columns=direct_max)
    result = solve_pass(cluster, free, jobs, s)
    check_plan(free, jobs, result)
    # Same input, same plan (the solver's wall time aside).
    again = solve_pass(cluster, free, jobs, s)
    timeless = msgspec.structs.replace
    assert timeless(again, solve_s=0.0) == timeless(result, solve_s=0.0)
    greedy = greedy_pass(cluster, free, jobs, s)
    check_plan(free, jobs, greedy)
    assert greedy_pass(cluster, free, jobs, s) == greedy


@given(instances())
@settings(max_examples=40, deadline=None)
def test_exact_direct_beats_greedy(
    inst: tuple[Cluster, dict[ServerId, int], list[PassJob]],
) -> None:
    cluster, free, jobs = inst
    exact = solve_pass(cluster, free, jobs, EXACT)
    assert exact.formulation in ("direct", "empty")
    assert exact.objective >= greedy_pass(cluster, free, jobs, EXACT).objective - 1e-6


@given(instances(uniform=True))
@settings(max_examples=60, deadline=None)
def test_class_formulation_matches_direct(
    inst: tuple[Cluster, dict[ServerId, int], list[PassJob]],
) -> None:
    cluster, free, jobs = inst
    direct = solve_pass(cluster, free, jobs, EXACT)
    klass_settings = SolverSettings(mip_rel_gap=0.0, accept_gap=0.0, direct_max_columns=0)
    klass = solve_pass(cluster, free, jobs, klass_settings)
    check_plan(free, jobs, klass)
    if direct.formulation == "empty":
        assert klass.formulation == "empty"
        return
    assert klass.formulation == "class"
    assert klass.objective == pytest.approx(direct.objective, rel=1e-6, abs=1e-6)


def test_large_pass_with_switch_factor_stays_within_the_gap() -> None:
    # Enough options for the restricted-model incumbent, running jobs with a
    # switch factor: the plan must be feasible, deterministic, and within the
    # accepted gap of the exact optimum (a large pass settles within it).
    servers = tuple(Server(ServerId(f"s{i:02d}"), A, 8) for i in range(12))
    cluster = Cluster((GpuTypeSpec(A, 1e9, 1e8),), servers)
    free = {s.id: 8 for s in servers}
    jobs = []
    for i in range(30):
        base = flat_job(f"j{i}", 1.0 + (i * 7) % 11, ((1, 2, 4), (2, 8), (4, 12, 16))[i % 3],
                        rho=(1.2, 2.0)[i % 2])
        current = Configuration.of({f"s{i % 12:02d}": base.requirements[0]}) if i < 12 else None
        jobs.append(msgspec.structs.replace(base, current=current, switch_factor=0.9))
    settings_ = SolverSettings()
    result = solve_pass(cluster, free, jobs, settings_)
    check_plan(free, jobs, result)
    timeless = msgspec.structs.replace
    assert timeless(solve_pass(cluster, free, jobs, settings_), solve_s=0.0) == timeless(
        result, solve_s=0.0)
    exact = solve_pass(cluster, free, jobs, EXACT)
    assert result.objective >= exact.objective / (1 + settings_.accept_gap) - 1e-9
    assert result.bound >= exact.objective - 1e-9
    assert result.gap <= settings_.accept_gap


def test_keep_servers_relabels_a_class_towards_current_placements() -> None:
    from scheduling.policies.hops.classes import keep_servers

    servers = [ServerId(f"s{i}") for i in range(4)]
    # Realised: job 0 on s0 (4 GPUs), job 1 on s0 (2) and job 2 over s1+s2.
    realised = [
        Configuration.of({"s0": 4}),
        Configuration.of({"s0": 2}),
        Configuration.of({"s1": 8, "s2": 4}),
    ]
    wanted = [Configuration.of({"s3": 4}), None, Configuration.of({"s0": 8, "s1": 4})]
    out = keep_servers(servers, realised, wanted)
    # Job 2 (largest) keeps s0+s1, job 0 keeps s3 and its server-mate job 1
    # moves with it: the permutation is a bijection of the class, so the
    # packing is unchanged up to names.
    assert out[2] == wanted[2]
    assert out[0] == wanted[0]
    assert out[0] is not None and out[1] is not None
    assert out[0].servers == out[1].servers
    assert sorted(g for c in out if c for _, g in c.parts) == [2, 4, 4, 8]
    used = [sid for c in out if c for sid in c.servers]
    assert set(used) <= set(servers)
