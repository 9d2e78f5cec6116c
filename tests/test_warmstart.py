"""Warm starts of a pass's MIP: releasing GPUs, the local search on a start,
and rounding the LP relaxation with the switch factor in mind."""

from __future__ import annotations

import random

import msgspec
import pytest

from scheduling.policies.hops import passes
from scheduling.policies.hops.formulation import Assignment, OptionSpace, class_space, direct_space
from scheduling.policies.hops.localsearch import improve
from scheduling.policies.hops.passes import PassJob, SolverSettings, solve_pass
from scheduling.policies.hops.planstate import PlanState
from scheduling.policies.hops.warmstart import _lp_rounding, everyone_at_best, greedy_assign
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId

A = GpuType("A")


def cluster(n: int, gpus: int = 8) -> Cluster:
    servers = tuple(Server(ServerId(f"s{i}"), A, gpus) for i in range(n))
    return Cluster((GpuTypeSpec(A, 1e9, 1e8),), servers)


def job(name: str, reqs: tuple[int, ...], base: float = 10.0, rho: float = 1.2) -> PassJob:
    curve = ThroughputCurve(tuple(base - 0.5 * k for k in range(8)), (base / rho,) * 7)
    return PassJob(JobId(name), 1.0, reqs, {A: rho}, JobEstimate(JobId(name), {A: curve}))


def value(chosen: Assignment, coeffs: list[float]) -> float:
    return sum(coeffs[o] for o, _ in chosen.values())


def feasible(space: OptionSpace, free: dict[ServerId, int], chosen: Assignment) -> bool:
    state = PlanState(space, free)
    for o, config in chosen.values():
        if not state.fits(config) or o not in space.per_job[space.options[o].job]:
            return False
        state.take(config)
    return True


def test_release_undoes_take() -> None:
    c = cluster(3)
    free = {ServerId("s0"): 8, ServerId("s1"): 8, ServerId("s2"): 5}
    jobs = [job("d", (12,)), job("a", (3,))]
    direct = direct_space(c, free, jobs, 1.4)
    klass = class_space(c, free, jobs, 1.4, 1000)
    assert klass is not None
    for space in (direct, klass):
        state = PlanState(space, free)
        before = (dict(state.free), {s: list(v) for s, v in state.items.items()})
        configs = [config for _, config in greedy_assign(space, state, len(jobs), {}).values()]
        assert len(configs) == 2
        for config in reversed(configs):
            state.release(config)
        assert (state.free, state.items) == before


def test_improve_swaps_a_cheap_job_out() -> None:
    c = cluster(1, gpus=4)
    free = {ServerId("s0"): 4}
    jobs = [job("cheap", (4,)), job("dear", (4,))]
    space = direct_space(c, free, jobs, 1.4)
    coeffs = [(0.1, 1.0)[o.job] * o.gain for o in space.options]
    state = PlanState(space, free)
    chosen = greedy_assign(space, state, 1, {})  # only "cheap" placed
    assert set(chosen) == {0}
    improve(space, coeffs, state, chosen)
    assert set(chosen) == {1}
    assert state.free[ServerId("s0")] == 0


def test_improve_moves_up_into_idle_gpus() -> None:
    c = cluster(2)
    free = {ServerId("s0"): 8, ServerId("s1"): 8}
    jobs = [job("a", (2, 4)), job("b", (8,))]
    space = direct_space(c, free, jobs, 1.4)
    coeffs = [o.gain for o in space.options]
    small = next(o for o in space.per_job[0] if space.options[o].gpus == 2)
    state = PlanState(space, free)
    config = state.place(space.options[small])
    assert config is not None
    state.take(config)
    chosen = greedy_assign(space, state, 2, {0: (small, config)})
    improve(space, coeffs, state, chosen)
    assert space.options[chosen[0][0]].gpus == 4
    assert feasible(space, free, chosen)


def test_improve_never_lowers_the_objective_and_is_deterministic() -> None:
    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(2, 6)
        c = cluster(n)
        free = {ServerId(f"s{i}"): rng.choice((2, 4, 8)) for i in range(n)}
        jobs = [job(f"j{k}", tuple(sorted(rng.sample((1, 2, 4, 8, 12, 16), 2))),
                    base=rng.uniform(5, 20), rho=rng.choice((1.2, 3.0)))
                for k in range(rng.randint(2, 8))]
        weights = [rng.uniform(0.05, 1.0) for _ in jobs]
        for space in (direct_space(c, free, jobs, 1.4), class_space(c, free, jobs, 1.4, 1000)):
            assert space is not None
            coeffs = [weights[o.job] * o.gain for o in space.options]
            runs = []
            for _ in range(2):
                state = PlanState(space, free)
                chosen = greedy_assign(space, state, len(jobs), {})
                before = value(chosen, coeffs)
                improve(space, coeffs, state, chosen)
                assert value(chosen, coeffs) >= before - 1e-12
                assert feasible(space, free, chosen)
                runs.append(dict(chosen))
            assert runs[0] == runs[1]


def test_lp_rounding_keeps_whole_columns_first() -> None:
    # The LP keeps "small" on its current server s0 (the switch factor favours
    # that column) and splits "big" over s0 and s1: rounding must not let
    # "big" take s0 by first fit and push "small" off its current server.
    c = cluster(2, gpus=4)
    free = {ServerId("s0"): 4, ServerId("s1"): 4}
    jobs = [job("big", (4,)), job("small", (2,))]
    space = direct_space(c, free, jobs, 1.4)
    at = {(o.job, o.config): k for k, o in enumerate(space.options)}
    here = Configuration.of({"s0": 2})
    coeffs = [o.gain * (1.0 if (o.job, o.config) == (1, here) else 0.9) for o in space.options]
    x = [0.0] * len(space.options)
    x[at[(0, Configuration.of({"s0": 4}))]] = 0.5
    x[at[(0, Configuration.of({"s1": 4}))]] = 0.5
    x[at[(1, here)]] = 1.0
    chosen, _ = _lp_rounding(space, x, coeffs, free)
    assert chosen[1][1] == here
    assert chosen[0][1] == Configuration.of({"s1": 4})


# --- the plan that needs no solve ----------------------------------------------


def test_running_jobs_at_their_best_are_kept_without_a_solve() -> None:
    c = cluster(2)
    s0 = ServerId("s0")
    running = msgspec.structs.replace(
        job("run", (4,)), current=Configuration(((s0, 4),)), switch_factor=0.9)
    jobs = [running, job("new", (4,))]
    free = {s0: 8, ServerId("s1"): 8}
    result = solve_pass(c, free, jobs)
    # "run" keeps s0 (any move costs the switch factor), "new" takes 4 GPUs
    # (all its options are worth the same): Eq. (11)'s upper bound, proven.
    assert result.status == "Optimal" and result.solve_s == 0.0
    assert result.choices[0].config == running.current
    assert result.choices[1].config.total_gpus == 4
    assert result.objective == result.bound


def test_a_job_below_its_best_goes_to_the_solver() -> None:
    c = cluster(1)
    s0 = ServerId("s0")
    small = msgspec.structs.replace(
        job("grow", (2, 8), base=10.0, rho=1.0), current=Configuration(((s0, 2),)),
        switch_factor=0.9)
    free = {s0: 8}
    space = direct_space(c, free, [small], 1.4)
    coeffs = [o.gain * (1.0 if o.config == small.current else 0.9) for o in space.options]
    assert everyone_at_best(space, coeffs, free, {0: small.current}) is None
    result = solve_pass(c, free, [small])
    assert result.choices[0].config.total_gpus == 8  # worth the restart


def test_the_shortcut_agrees_with_the_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    # Random small passes where the running jobs keep their places: whenever
    # the shortcut answers, the MIP (solved with the shortcut switched off)
    # finds nothing better.
    fired = 0
    for seed in range(30):
        rng = random.Random(seed)
        c = cluster(3, gpus=4)
        free = {s.id: 4 for s in c.servers}
        jobs, used = [], {s.id: 0 for s in c.servers}
        for k in range(rng.randint(1, 4)):
            reqs = tuple(sorted(rng.sample((1, 2, 4), rng.randint(1, 2))))
            pj = job(f"j{k}", reqs, base=rng.uniform(5, 15), rho=rng.uniform(1.0, 2.0))
            sid = c.servers[k % 3].id
            if rng.random() < 0.6 and used[sid] + reqs[0] <= 4:
                used[sid] += reqs[0]
                pj = msgspec.structs.replace(
                    pj, current=Configuration(((sid, reqs[0]),)), switch_factor=0.9)
            jobs.append(pj)
        fast = solve_pass(c, free, jobs)
        if fast.solve_s == 0.0 and fast.status == "Optimal":
            fired += 1
            with monkeypatch.context() as m:
                m.setattr(passes, "everyone_at_best", lambda *_: None)
                exact = solve_pass(c, free, jobs, SolverSettings(mip_rel_gap=1e-9))
            assert exact.solve_s > 0.0
            assert fast.objective >= exact.objective - 1e-9
    assert fired >= 3
