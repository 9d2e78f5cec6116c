"""The baselines of hare.md §7.1, the task-level simulator, its workloads and
ground truth, and ``hops experiment hare``."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.hare.run import HareExperiment, jobs_on
from experiments.hare.run import run as run_experiment
from experiments.hare.workload import HareWorkload, cluster_gpus, generate, ideal_round_s
from scheduling.policies.hare.assignment import min_cost_assignment
from scheduling.policies.hare.baselines import GavelFifo, Homo, Srtf
from scheduling.policies.hare.baselines_allox import Allox
from scheduling.policies.hare.checks import check_schedule
from scheduling.policies.hare.model import (
    Gpu,
    GpuId,
    Task,
    TaskJob,
    TaskPolicy,
    TaskProblem,
    TaskSchedule,
)
from scheduling.policies.hare.names import TASK_POLICIES, task_policy
from shared.ids import GpuType, JobId
from simulator.tasks import TaskSimSettings, TaskSimulation, simulate
from simulator.tasks_result import RunTask
from world.hare import CATEGORIES, CLUSTERS, SWITCH_S, cluster_shape, ps_sync_time, task_models

V100, K80 = GpuType("V100"), GpuType("K80")
BASELINES: tuple[TaskPolicy, ...] = (GavelFifo(), Srtf(), Homo(), Allox())


def job(name: str, arrival: float, rounds: int, scale: int, v100: float, k80: float | None = None,
        sync: float = 0.0, weight: float = 1.0) -> TaskJob:
    compute = {V100: v100} if k80 is None else {V100: v100, K80: k80}
    return TaskJob(JobId(name), arrival, rounds, scale, compute,
                   dict.fromkeys(compute, sync), weight=weight)


def gpus(*types: GpuType) -> tuple[Gpu, ...]:
    return tuple(Gpu(GpuId(f"g{i}"), t) for i, t in enumerate(types))


def placed(schedule: TaskSchedule) -> list[tuple[str, int, int, str, float]]:
    return sorted((t.job, t.round, t.index, t.gpu, t.start_s) for t in schedule.tasks)


# --- the baselines on hand-made problems ------------------------------------------------


def test_fifo_blocks_the_head_of_the_line() -> None:
    """c could run at once on g1, but FIFO keeps it behind b, which waits
    for both GPUs."""
    p = TaskProblem((job("a", 0.0, 2, 1, 1.0), job("b", 0.1, 1, 2, 1.0), job("c", 0.2, 1, 1, 1.0)),
                    gpus(V100, V100))
    s = GavelFifo().schedule(p)
    check_schedule(p, s)
    assert placed(s) == [("a", 0, 0, "g0", 0.0), ("a", 1, 0, "g0", 1.0),
                         ("b", 0, 0, "g0", 2.0), ("b", 0, 1, "g1", 2.0), ("c", 0, 0, "g0", 3.0)]


def test_srtf_starts_the_short_job_and_backfills() -> None:
    p = TaskProblem((job("long", 0.0, 5, 1, 1.0), job("short", 0.0, 1, 1, 1.0)), gpus(V100))
    assert placed(Srtf().schedule(p))[:2] == [("long", 0, 0, "g0", 1.0), ("long", 1, 0, "g0", 2.0)]
    assert ("short", 0, 0, "g0", 0.0) in placed(Srtf().schedule(p))
    # Unlike FIFO, c does not wait behind b.
    p = TaskProblem((job("a", 0.0, 2, 1, 1.0), job("b", 0.1, 1, 2, 1.0), job("c", 0.2, 1, 1, 1.0)),
                    gpus(V100, V100))
    assert ("c", 0, 0, "g1", 0.2) in placed(Srtf().schedule(p))


def test_fifo_and_srtf_take_the_fastest_gpus() -> None:
    p = TaskProblem((job("a", 0.0, 3, 1, 1.0, 4.0),), gpus(K80, V100))
    for policy in (GavelFifo(), Srtf()):
        assert {t.gpu for t in policy.schedule(p).tasks} == {"g1"}


def test_homo_ignores_speed_and_follows_smiths_rule() -> None:
    p = TaskProblem((job("a", 0.0, 3, 1, 1.0, 4.0),), gpus(K80, V100))
    assert {t.gpu for t in Homo().schedule(p).tasks} == {"g0"}  # the first GPU, a K80
    # One GPU: w/p of heavy = 3/2 beats light's 1/1, though light arrived first.
    p = TaskProblem((job("light", 0.0, 1, 1, 1.0), job("heavy", 0.0, 2, 1, 1.0, weight=3.0)),
                    gpus(V100))
    assert placed(Homo().schedule(p)) == [("heavy", 0, 0, "g0", 0.0), ("heavy", 1, 0, "g0", 1.0),
                                          ("light", 0, 0, "g0", 2.0)]


def test_homo_plans_with_the_real_times() -> None:
    """The mean view picks the GPUs; the plan's times are the real ones."""
    p = TaskProblem((job("a", 0.0, 2, 2, 1.0, 3.0, sync=0.5),), gpus(K80, V100))
    s = Homo().schedule(p)
    check_schedule(p, s)
    assert placed(s) == [("a", 0, 0, "g0", 0.0), ("a", 0, 1, "g1", 0.0),
                         ("a", 1, 0, "g0", 3.5), ("a", 1, 1, "g1", 3.5)]


def test_allox_matches_the_job_that_needs_the_fast_gpu_to_it() -> None:
    """a barely cares, b is 10x slower on the K80: a goes to the K80 though
    FIFO gives it the V100."""
    p = TaskProblem((job("a", 0.0, 1, 1, 1.0, 1.5), job("b", 0.0, 1, 1, 1.0, 10.0)),
                    gpus(V100, K80))
    s = Allox().schedule(p)
    check_schedule(p, s)
    assert placed(s) == [("a", 0, 0, "g1", 0.0), ("b", 0, 0, "g0", 0.0)]
    assert ("a", 0, 0, "g0", 0.0) in placed(GavelFifo().schedule(p))


def test_allox_orders_a_pool_shortest_first_and_keeps_one_type() -> None:
    p = TaskProblem((job("long", 0.0, 4, 1, 1.0), job("short", 0.0, 1, 1, 1.0)), gpus(V100))
    assert placed(Allox().schedule(p))[0] == ("long", 0, 0, "g0", 1.0)
    p = TaskProblem((job("two", 0.0, 1, 2, 1.0, 1.0),), gpus(K80, V100))
    with pytest.raises(ValueError, match="no GPU type has 2 GPUs"):
        Allox().schedule(p)


def test_running_jobs_resume_first_on_a_replan() -> None:
    """A running job (ready_s) resumes at its barrier before a newcomer that
    every non-preemptive baseline would otherwise prefer."""
    running = job("run", 0.0, 10, 1, 1.0, weight=1.0)
    running = msgspec.structs.replace(running, done_rounds=5)
    p = TaskProblem((running, job("new", 4.0, 1, 1, 1.0, weight=100.0)), gpus(V100), now=4.0,
                    ready_s={JobId("run"): 5.0})
    for policy in (GavelFifo(), Homo(), Allox()):
        s = policy.schedule(p)
        check_schedule(p, s)
        assert ("run", 5, 0, "g0", 5.0) in placed(s)
    assert ("new", 0, 0, "g0", 4.0) in placed(Srtf().schedule(p))  # SRTF preempts


def test_min_cost_assignment_is_optimal() -> None:
    import itertools

    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 5))
        m = int(rng.integers(n, 7))
        cost = rng.integers(0, 9, (n, m)).astype(float)
        got = min_cost_assignment(cost)
        assert len(set(got)) == n
        best = min(sum(cost[i, c[i]] for i in range(n))
                   for c in itertools.permutations(range(m), n))
        assert sum(cost[i, got[i]] for i in range(n)) == best


def test_names_resolve_every_policy() -> None:
    for name in TASK_POLICIES:
        assert task_policy(name).name == name
    with pytest.raises(ValueError, match="unknown task policy"):
        task_policy("nope")


# --- properties of the baselines ---------------------------------------------------------


@st.composite
def problems(draw: st.DrawFn) -> TaskProblem:
    """Small problems, some mid-run (now, ready_s, done rounds, busy GPUs);
    every job fits one type's GPUs, as AlloX needs."""
    n_v, n_k = draw(st.integers(1, 3)), draw(st.integers(0, 2))
    now = draw(st.sampled_from([0.0, 1.5]))
    free = st.sampled_from([0.0, 1.0, 2.5])
    pool = tuple(Gpu(GpuId(f"g{i}"), V100 if i < n_v else K80, draw(free))
                 for i in range(n_v + n_k))
    jobs: list[TaskJob] = []
    ready: dict[JobId, float] = {}
    for i in range(draw(st.integers(1, 4))):
        rounds = draw(st.integers(1, 3))
        j = job(f"j{i}", draw(st.sampled_from([0.0, 0.5, 2.0])), rounds,
                draw(st.integers(1, n_v)), draw(st.sampled_from([0.5, 1.0])),
                draw(st.sampled_from([1.0, 3.0])), sync=draw(st.sampled_from([0.0, 0.25])),
                weight=draw(st.sampled_from([1.0, 2.0])))
        if now > 0 and draw(st.booleans()):
            j = msgspec.structs.replace(j, done_rounds=draw(st.integers(0, rounds - 1)))
            ready[j.id] = now + draw(st.sampled_from([0.0, 0.7]))
        jobs.append(j)
    return TaskProblem(tuple(jobs), pool, now, ready)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_baseline_schedule_is_feasible_and_deterministic(p: TaskProblem) -> None:
    for policy in BASELINES:
        s = policy.schedule(p)
        check_schedule(p, s)  # exactly each round's tasks, no overlap, barriers, releases
        assert s == policy.schedule(p)
        by_gpu: dict[str, list[Task]] = {}
        for t in s.tasks:
            by_gpu.setdefault(t.gpu, []).append(t)
        for tasks in by_gpu.values():
            tasks.sort(key=lambda t: t.start_s)
            assert all(a.end_s <= b.start_s + 1e-9 for a, b in itertools.pairwise(tasks))


# --- the simulator -------------------------------------------------------------------


def test_a_job_alone_finishes_after_rounds_times_its_barrier() -> None:
    """7 rounds of max(1 + 0.5, 3 + 0.5) with one task on the K80, as the
    homogeneity-blind baseline places it; any grouping into macro-rounds
    gives the same finish."""
    alone = (job("a", 2.0, 7, 2, 1.0, 3.0, sync=0.5),)
    for budget in (1, 4, 10_000):
        r = simulate(alone, gpus(K80, V100, V100), Homo(), TaskSimSettings(budget=budget))
        assert r.jobs[0].finish_s == pytest.approx(2.0 + 7 * 3.5)
        r = simulate(alone, gpus(K80, V100, V100), GavelFifo(), TaskSimSettings(budget=budget))
        assert r.jobs[0].finish_s == pytest.approx(2.0 + 7 * 1.5)
        assert r.weighted_jct_h == pytest.approx(7 * 1.5 / 3600)


def test_switch_cost_only_when_a_gpu_changes_job() -> None:
    jobs = (job("a", 0.0, 2, 1, 1.0, sync=0.5), job("b", 0.0, 3, 1, 1.0))
    r = simulate(jobs, gpus(V100), GavelFifo(), TaskSimSettings(switch_s=0.25, record=True))
    charged = [(t.job, t.first_round, t.switch_s) for t in r.tasks]
    assert charged == [("a", 0, 0.0), ("a", 1, 0.0), ("b", 0, 0.25), ("b", 1, 0.0),
                       ("b", 2, 0.0)]
    finish = {j.id: j.finish_s for j in r.jobs}
    assert finish == {"a": pytest.approx(3.0), "b": pytest.approx(2.5 + 0.25 + 3.0)}


class Lazy:
    """Places only the first round of each job: an infeasible plan."""

    name = "lazy"

    def schedule(self, problem: TaskProblem) -> TaskSchedule:
        full = GavelFifo().schedule(problem)
        return TaskSchedule(tuple(t for t in full.tasks if t.round == 0))


def test_the_simulator_rejects_an_infeasible_plan() -> None:
    with pytest.raises(ValueError, match="missing"):
        simulate((job("a", 0.0, 3, 1, 1.0),), gpus(V100), Lazy(), TaskSimSettings(budget=10))


class Spy(TaskSimulation):
    """Keeps every (real-round) problem the simulator builds."""

    seen: list[TaskProblem]

    def problem(self, now: float) -> TaskProblem:
        p = super().problem(now)
        self.seen = [*getattr(self, "seen", []), p]
        return p


@st.composite
def workloads(draw: st.DrawFn) -> tuple[tuple[TaskJob, ...], tuple[Gpu, ...]]:
    pool = gpus(*[V100] * draw(st.integers(1, 3)), *[K80] * draw(st.integers(0, 2)))
    jobs = tuple(
        job(f"j{i}", draw(st.sampled_from([0.0, 0.3, 1.0, 2.2, 4.0])), draw(st.integers(1, 6)),
            draw(st.integers(1, sum(g.type == V100 for g in pool))),
            draw(st.sampled_from([0.4, 1.0])), draw(st.sampled_from([0.9, 2.5])),
            sync=draw(st.sampled_from([0.0, 0.2])))
        for i in range(draw(st.integers(1, 5))))
    return jobs, pool


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(BASELINES), st.sampled_from([3, 8, 10_000]))
def test_online_runs_conserve_tasks_and_never_move_started_ones(
        w: tuple[tuple[TaskJob, ...], tuple[Gpu, ...]], policy: TaskPolicy, budget: int) -> None:
    jobs, pool = w
    sim = Spy(jobs, pool, policy, TaskSimSettings(budget=budget, switch_s=0.1, record=True))
    r = sim.run()
    check_each_task_once(r.tasks, jobs)  # conservation
    # A replan at t only sees rounds that no task started before t.
    for p in sim.seen:
        front = {j.id: j.done_rounds for j in p.jobs}
        for t in r.tasks:
            if t.job in front and t.start_s < p.now:
                assert t.first_round + t.rounds <= front[t.job]
    _check_execution(r.tasks, jobs)
    assert r == Spy(jobs, pool, policy, TaskSimSettings(budget=budget, switch_s=0.1,
                                                        record=True)).run()


def check_each_task_once(tasks: tuple[RunTask, ...], jobs: tuple[TaskJob, ...]) -> None:
    """Every real task (micro-batch) of every job ran exactly once."""
    ran: dict[tuple[str, int, int], int] = {}
    for t in tasks:
        for rnd in range(t.first_round, t.first_round + t.rounds):
            key = (t.job, rnd, t.index)
            ran[key] = ran.get(key, 0) + 1
    want = {(j.id, rnd, k) for j in jobs for rnd in range(j.rounds)
            for k in range(j.tasks_per_round)}
    assert set(ran) == want and set(ran.values()) == {1}


def _check_execution(tasks: tuple[RunTask, ...], jobs: tuple[TaskJob, ...]) -> None:
    """One task at a time per GPU; a job's rounds after its arrival and in
    barrier order; the job finishes at its last barrier."""
    arrival = {j.id: j.arrival_s for j in jobs}
    by_gpu: dict[str, list[RunTask]] = {}
    for t in tasks:
        by_gpu.setdefault(t.gpu, []).append(t)
        assert t.start_s >= arrival[t.job]
    for run in by_gpu.values():
        run.sort(key=lambda t: t.start_s)
        assert all(a.end_s <= b.start_s + 1e-9 for a, b in itertools.pairwise(run))
    for j in jobs:
        mine = [t for t in tasks if t.job == j.id]
        for t in mine:
            before = [u for u in mine if u.first_round + u.rounds <= t.first_round]
            assert all(u.done_s <= t.start_s + 1e-9 for u in before)


# --- workloads, ground truth, the experiment --------------------------------------------


def test_ground_truth_of_the_task_model() -> None:
    models = task_models()
    assert {m.category for m in models.values()} == set(CATEGORIES)
    assert sum(cluster_shape("testbed").values()) == 15
    assert all(sum(CLUSTERS[c].values()) == 160 for c in ("mixed-160", "v100-160"))
    resnet = models["gavel:ResNet-50 (batch size 64)"]
    assert resnet.compute_s[K80] > 5 * resnet.compute_s[V100]
    # 2 x 4 B x 25.56 M params over 25 Gbps, plus 1 ms.
    assert resnet.sync_s[V100] == pytest.approx(2 * 4 * 25_557_032 / 3.125e9 + 1e-3)
    assert ps_sync_time(1_000_000, net_gbps=8.0, latency_s=0.0) == pytest.approx(0.008)
    assert 0 < SWITCH_S <= 6e-3  # Table 3: Hare's switches take at most 6 ms


def test_workloads_are_seeded_and_offer_the_load() -> None:
    models = task_models()
    spec = HareWorkload(jobs=120, load=0.8)
    a = generate(spec, models, 160, np.random.default_rng(7))
    assert a == generate(spec, models, 160, np.random.default_rng(7))
    assert a != generate(spec, models, 160, np.random.default_rng(8))
    assert a[0].arrival_s == 0.0
    assert all(x.arrival_s <= y.arrival_s for x, y in itertools.pairwise(a))
    assert {j.tasks_per_round for j in a} <= {1, 2, 4, 8}
    cats = {m.name: m.category for m in models.values()}
    assert {cats[j.model] for j in a} == set(CATEGORIES)
    work = sum(j.tasks_per_round * j.rounds * ideal_round_s(models[j.model]) for j in a)
    load = work / a[-1].arrival_s / 160
    assert 0.5 < load < 1.3  # a Poisson draw of 120 arrivals around 0.8
    for j in a:
        minutes = j.rounds * ideal_round_s(models[j.model]) / 60
        lo, hi = spec.minutes[cats[j.model]]
        assert lo * 0.99 <= minutes <= hi * 1.01 or j.rounds == 1
    mixed = cluster_gpus(cluster_shape("mixed-160"))
    assert len(mixed) == 160 and {g.type for g in mixed[:3]} == {V100, K80, GpuType("P100")}


def test_experiment_writes_its_results(tmp_path: Path) -> None:
    exp = HareExperiment(jobs=40, seed=1, clusters=("testbed",), policies=("gavel-fifo", "allox"),
                         budget=500)
    assert jobs_on(exp, 15) == 4
    results = run_experiment(tmp_path, exp)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk == results
    assert set(on_disk) == {"testbed"} and set(on_disk["testbed"]) == {"gavel-fifo", "allox"}
    for m in on_disk["testbed"].values():
        assert {"weighted_jct_h", "avg_jct_h", "makespan_h", "share_done_25min"} <= set(m)
        assert m["weighted_jct_h"] > 0 and 0 <= m["share_done_25min"] <= 1
        assert not math.isnan(m["plan_total_s"])
    setup = json.loads((tmp_path / "setup.json").read_text())
    assert "commit" in setup["provenance"] and setup["clusters"]["testbed"]["gpus"] == 15
    assert "| gavel-fifo |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "jct_cdf_testbed.png").stat().st_size > 0
