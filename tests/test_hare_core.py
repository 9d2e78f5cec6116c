"""Hare's task scheduler (hare.md §5, Algorithm 1): the worked example, the
constraints (4)-(8) on random instances, the relaxation as a lower bound,
Theorem 4's ratio against brute-force optima, the checker on broken
schedules, and the macro-task grouping."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduling.policies.hare.brute import optimum
from scheduling.policies.hare.checks import (
    check_schedule,
    completion_times,
    release_s,
    usable_types,
    weighted_completion,
    weighted_jct,
)
from scheduling.policies.hare.greedy import MinTree, greedy
from scheduling.policies.hare.macro import group, macro_problem, rounds_per_macro
from scheduling.policies.hare.model import (
    Gpu,
    GpuId,
    Task,
    TaskJob,
    TaskPolicy,
    TaskProblem,
    TaskSchedule,
)
from scheduling.policies.hare.policy import HarePolicy, HareSettings
from scheduling.policies.hare.relax import queyranne_rhs, relax, water_fill
from shared.ids import GpuType, JobId

FAST, SLOW, MID = GpuType("v100"), GpuType("k80"), GpuType("p100")
TYPES = (FAST, MID, SLOW)
HARE = HarePolicy()
EFT = HarePolicy(HareSettings(placement="earliest-finish"))
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TINY = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def job(name: str, compute: dict[GpuType, float], *, tasks: int = 1, rounds: int = 1,
        **kw: object) -> TaskJob:
    return msgspec.convert(
        {"id": name, "arrival_s": 0.0, "rounds": rounds, "tasks_per_round": tasks,
         "compute_s": compute, **kw},
        TaskJob,
    )


def gpu(name: str, kind: GpuType, free_s: float = 0.0) -> Gpu:
    return Gpu(GpuId(name), kind, free_s)


def example() -> TaskProblem:
    """One fast GPU (T^c = 1), one slow (T^c = 3), a round of two tasks."""
    return TaskProblem(
        jobs=(job("a", {FAST: 1.0, SLOW: 3.0}, tasks=2),),
        gpus=(gpu("F", FAST), gpu("S", SLOW)),
    )


def test_worked_example_line_12_takes_the_slow_gpu_eft_waits_for_the_fast_one() -> None:
    problem = example()
    literal, eft = HARE.schedule(problem), EFT.schedule(problem)
    assert [(t.index, t.gpu, t.start_s) for t in literal.tasks] == [(0, "F", 0.0), (1, "S", 0.0)]
    assert [(t.index, t.gpu, t.start_s) for t in eft.tasks] == [(0, "F", 0.0), (1, "F", 1.0)]
    assert completion_times(problem, literal) == {"a": 3.0}
    assert weighted_jct(problem, eft) == 2.0
    assert optimum(problem)[0] == 2.0
    # C >= x + T^min = 1 is all the LP can say: the job's (9') row is slack.
    assert literal.lower_bound == pytest.approx(1.0)
    assert HARE.name == "hare" and EFT.name == "hare-eft"


# ---------------------------------------------------------------- instances


@st.composite
def problems(draw: st.DrawFn, *, jobs: int = 4, rounds: int = 4, tasks: int = 3,
             gpus: int = 4) -> TaskProblem:
    half = st.integers(1, 16).map(lambda v: v / 2)
    types = TYPES[:draw(st.integers(1, 3))]
    cluster = tuple(
        gpu(f"g{m}", draw(st.sampled_from(types)), draw(st.sampled_from((0.0, 0.0, 1.5, 4.0))))
        for m in range(draw(st.integers(1, gpus)))
    )
    present = sorted({g.type for g in cluster})
    now = draw(st.sampled_from((0.0, 0.0, 2.0)))
    out, ready = [], {}
    for n in range(draw(st.integers(1, jobs))):
        runs = draw(st.lists(st.sampled_from(present), min_size=1, unique=True))
        extra = [t for t in TYPES if t not in present][:draw(st.integers(0, 1))]
        synced = draw(st.booleans())
        r = draw(st.integers(1, rounds))
        out.append(job(
            f"j{n}", {t: draw(half) for t in [*runs, *extra]}, tasks=draw(st.integers(1, tasks)),
            rounds=r, done_rounds=draw(st.integers(0, r - 1)),
            sync_s={t: draw(half) / 4 for t in runs} if synced else {},
            arrival_s=draw(st.integers(0, 12).map(float)), weight=draw(half),
        ))
        if draw(st.integers(0, 3)) == 0:
            ready[JobId(f"j{n}")] = draw(st.integers(0, 10).map(float))
    return TaskProblem(jobs=tuple(out), gpus=cluster, now=now, ready_s=ready)


def n_tasks(problem: TaskProblem) -> int:
    return sum(j.remaining_rounds * j.tasks_per_round for j in problem.jobs)


def alpha(problem: TaskProblem) -> float:
    """Lemma 3's α: the largest max/min ratio of a task's compute or sync time
    over the types that can run it (sync 0 everywhere counts as ratio 1)."""
    worst = 1.0
    for j in problem.jobs:
        types = usable_types(problem, j)
        compute = [j.compute_s[t] for t in types]
        sync = [j.sync(t) for t in types]
        worst = max(worst, max(compute) / min(compute))
        if max(sync) > 0:
            worst = max(worst, max(sync) / min(sync) if min(sync) > 0 else math.inf)
    return worst


def assert_no_gpu_overlap(problem: TaskProblem, schedule: TaskSchedule) -> None:
    """(8) checked here on its own, not through check_schedule."""
    free = {g.id: g.free_s for g in problem.gpus}
    by_gpu: defaultdict[str, list[Task]] = defaultdict(list)
    for t in schedule.tasks:
        by_gpu[t.gpu].append(t)
    for g, tasks in by_gpu.items():
        busy_until = free[GpuId(g)]
        for t in sorted(tasks, key=lambda t: t.start_s):
            assert t.start_s >= busy_until - 1e-9, (g, t)
            busy_until = t.start_s + t.compute_s


# ----------------------------------------------------------------- properties


@PROPS
@given(problems())
def test_both_placements_are_feasible_complete_deterministic_and_bounded(
    problem: TaskProblem,
) -> None:
    for policy in (HARE, EFT):
        schedule = policy.schedule(problem)
        check_schedule(problem, schedule)
        assert_no_gpu_overlap(problem, schedule)
        counts = Counter((t.job, t.round) for t in schedule.tasks)
        assert counts == {
            (j.id, r): j.tasks_per_round for j in problem.jobs
            for r in range(j.done_rounds, j.rounds)
        }
        assert policy.schedule(msgspec.convert(msgspec.to_builtins(problem), TaskProblem)) \
            == schedule
        value = weighted_completion(problem, schedule)
        assert schedule.lower_bound is not None
        assert schedule.lower_bound <= value * (1 + 1e-7) + 1e-7


@PROPS
@given(problems())
def test_relaxation_rows_hold_for_every_schedule_found(problem: TaskProblem) -> None:
    """(9') directly: Σ p_i x_i >= Q(A) for the schedules of both placements."""
    for schedule in (HARE.schedule(problem), EFT.schedule(problem)):
        everyone_x, everyone_p = [], []
        able = {t for j in problem.jobs for t in usable_types(problem, j)}
        first = min(release_s(problem, j) for j in problem.jobs)
        for j in problem.jobs:
            types = usable_types(problem, j)
            p = min(j.compute_s[t] for t in types)
            x = np.array([t.start_s for t in schedule.tasks if t.job == j.id])
            ready = np.array([max(g.free_s, release_s(problem, j))
                              for g in problem.gpus if g.type in types])
            assert p * x.sum() >= queyranne_rhs(np.full(x.size, p), ready) - 1e-7
            everyone_x += x.tolist()
            everyone_p += [p] * x.size
        ready = np.array([max(g.free_s, first) for g in problem.gpus if g.type in able])
        p_all = np.array(everyone_p)
        assert float(np.dot(p_all, everyone_x)) >= queyranne_rhs(p_all, ready) - 1e-7


@TINY
@given(problems(jobs=3, rounds=3, tasks=2, gpus=3))
def test_theorem_4_ratio_and_lower_bound_against_brute_force(problem: TaskProblem) -> None:
    assume(1 <= n_tasks(problem) <= 6)
    best, witness = optimum(problem)
    check_schedule(problem, witness)
    assert weighted_completion(problem, witness) == best
    ours = HARE.schedule(problem)
    value = weighted_completion(problem, ours)
    a = alpha(problem)
    assert best <= value * (1 + 1e-12)
    assert value <= a * (2 + a) * best * (1 + 1e-12)
    assert ours.lower_bound is not None and ours.lower_bound <= best * (1 + 1e-7) + 1e-7
    assert best <= weighted_completion(problem, EFT.schedule(problem)) * (1 + 1e-12)


# ------------------------------------------------------------- pinned cases


def test_queyranne_row_binds_on_one_gpu() -> None:
    """Four unit tasks on one GPU: (6)/(7) alone say C >= 1; (9') says the
    mean start is at least (P² + Σp²) / 2P - 1 = 1.5, so C >= 2.5 (OPT 4).
    A GPU busy until 10 shifts both by 10."""
    for free, bound in ((0.0, 2.5), (10.0, 12.5)):
        problem = TaskProblem(jobs=(job("a", {FAST: 1.0}, tasks=4),), gpus=(gpu("g", FAST, free),))
        schedule = HARE.schedule(problem)
        assert schedule.lower_bound == pytest.approx(bound)
        assert weighted_completion(problem, schedule) == free + 4.0


@PROPS
@given(problems())
def test_relaxation_solution_meets_its_rows_and_prices_completion(problem: TaskProblem) -> None:
    """x̂ satisfies (7) with T^min between rounds and (9') per job, and the
    optimum is Σ w_n (max x̂ of the last round + T_n^min): C_n is tight."""
    relaxed = relax(problem)
    total = 0.0
    for j in problem.jobs:
        types = usable_types(problem, j)
        fastest = min(j.compute_s[t] + j.sync(t) for t in types)
        p = min(j.compute_s[t] for t in types)
        x = np.array([[relaxed.starts[(j.id, r, k)] for k in range(j.tasks_per_round)]
                      for r in range(j.done_rounds, j.rounds)])
        assert x.min() >= release_s(problem, j) - 1e-7
        assert np.all(x[1:].min(axis=1) >= x[:-1].max(axis=1) + fastest - 1e-7)
        ready = np.array([max(g.free_s, release_s(problem, j))
                          for g in problem.gpus if g.type in types])
        assert p * x.sum() >= queyranne_rhs(np.full(x.size, p), ready) - 1e-6
        total += j.weight * (x[-1].max() + fastest)
    assert relaxed.objective == pytest.approx(total, rel=1e-7, abs=1e-7)


def test_rounds_are_released_only_when_the_previous_round_is_placed() -> None:
    """Starts that put round 1 before round 0 (as no LP would) still give a
    feasible schedule: round 1 waits until round 0 is placed and done."""
    problem = TaskProblem(jobs=(job("a", {FAST: 2.0}, tasks=2, rounds=2, sync_s={FAST: 0.5}),),
                          gpus=(gpu("g0", FAST), gpu("g1", FAST)))
    starts = {(JobId("a"), 0, 0): 5.0, (JobId("a"), 0, 1): 5.0,
              (JobId("a"), 1, 0): 0.0, (JobId("a"), 1, 1): 0.0}
    tasks = greedy(problem, starts)
    check_schedule(problem, TaskSchedule(tasks))
    assert [(t.round, t.gpu, t.start_s) for t in tasks] == [
        (0, "g0", 0.0), (0, "g1", 0.0), (1, "g0", 2.5), (1, "g1", 2.5)]


def test_replan_respects_now_ready_free_and_done_rounds() -> None:
    problem = TaskProblem(
        jobs=(job("a", {FAST: 1.0}, rounds=3, done_rounds=2, arrival_s=1.0),),
        gpus=(gpu("busy", FAST, free_s=9.0), gpu("idle", FAST, free_s=3.0)),
        now=4.0, ready_s={JobId("a"): 6.0},
    )
    for policy in (HARE, EFT):
        schedule = policy.schedule(problem)
        assert [(t.round, t.gpu, t.start_s) for t in schedule.tasks] == [(2, "idle", 6.0)]
        assert schedule.lower_bound == pytest.approx(7.0)


def test_eft_ties_go_to_gpu_order_line_12_to_the_earliest_free() -> None:
    problem = TaskProblem(jobs=(job("a", {FAST: 1.0}, arrival_s=5.0),),
                          gpus=(gpu("late", FAST, free_s=2.0), gpu("early", FAST)))
    assert HARE.schedule(problem).tasks[0].gpu == "early"
    assert EFT.schedule(problem).tasks[0].gpu == "late"


def test_empty_problem_and_settings() -> None:
    assert HARE.schedule(TaskProblem(jobs=(), gpus=(gpu("g", FAST),))) == TaskSchedule((), 0.0)
    with pytest.raises(ValueError, match="placement"):
        HareSettings(placement="random")  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"placement": "earliest-free", "seed": 1}, HareSettings)
    policy: TaskPolicy = HarePolicy(msgspec.convert({"placement": "earliest-finish"},
                                                    HareSettings))
    assert policy.name == "hare-eft"
    with pytest.raises(ValueError, match="no GPU"):
        HARE.schedule(TaskProblem(jobs=(job("a", {SLOW: 1.0}),), gpus=(gpu("g", FAST),)))


def test_water_fill_and_min_tree() -> None:
    assert water_fill(4.0, np.array([0.0, 0.0])) == pytest.approx(4.0)  # P² / 2|M|
    assert water_fill(4.0, np.array([10.0, 0.0])) == pytest.approx(8.0)  # all on one
    assert water_fill(4.0, np.array([1.0, 0.0])) == pytest.approx(0.5 * 2.5**2 + 1.5 + 1.5**2 / 2)
    tree = MinTree([3.0, 1.0, 1.0, 5.0, 0.5])
    assert tree.leftmost_min() == (0.5, 4)
    assert tree.leftmost_at_most(1.0) == 1
    tree.set(4, 9.0)
    assert tree.leftmost_min() == (1.0, 1) and tree.leftmost_at_most(0.9) is None


# ------------------------------------------------------------------ checker


def two_rounds() -> tuple[TaskProblem, list[Task]]:
    problem = TaskProblem(
        jobs=(job("a", {FAST: 1.0, SLOW: 2.0}, tasks=2, rounds=2, sync_s={FAST: 0.5}),),
        gpus=(gpu("f", FAST), gpu("s", SLOW, free_s=1.0)),
    )
    a = JobId("a")
    tasks = [Task(a, 0, 0, GpuId("f"), 0.0, 1.0, 0.5), Task(a, 0, 1, GpuId("s"), 1.0, 2.0),
             Task(a, 1, 0, GpuId("f"), 3.0, 1.0, 0.5), Task(a, 1, 1, GpuId("f"), 4.0, 1.0, 0.5)]
    return problem, tasks


@pytest.mark.parametrize(("change", "message"), [
    (lambda ts: ts[:3], r"tasks: task \('a', 1, 1\) of job a is missing"),
    (lambda ts: [*ts, ts[0]], "placed twice"),
    (lambda ts: [*ts[:3], msgspec.structs.replace(ts[3], round=2)], "outside job a"),
    (lambda ts: [*ts[:3], msgspec.structs.replace(ts[3], start_s=3.5)], r"\(8\).*overlap on GPU f"),
    (lambda ts: [ts[0], ts[1], msgspec.structs.replace(ts[2], start_s=2.5), ts[3]],
     r"\(7\): task \('a', 1, 0\) starts at 2.5, before task \('a', 0, 1\)"),
    (lambda ts: [ts[0], msgspec.structs.replace(ts[1], gpu="f", start_s=1.0), *ts[2:]],
     r"\(5\).*has compute/sync 2.0/0.0 s, but job a takes 1.0/0.5 s on type v100"),
    (lambda ts: [ts[0], msgspec.structs.replace(ts[1], gpu="x"), *ts[2:]], r"\(5\).*GPU x"),
    (lambda ts: [ts[0], msgspec.structs.replace(ts[1], start_s=0.5), *ts[2:]],
     r"\(8\).*before GPU s is free at 1.0"),
    (lambda ts: [msgspec.structs.replace(ts[0], start_s=-1.0), *ts[1:]], r"\(4\)"),
])
def test_checker_names_the_broken_constraint(change: object, message: str) -> None:
    problem, tasks = two_rounds()
    check_schedule(problem, TaskSchedule(tuple(tasks)))
    assert weighted_completion(problem, TaskSchedule(tuple(tasks))) == 5.5
    with pytest.raises(ValueError, match=message):
        check_schedule(problem, TaskSchedule(tuple(change(tasks))))  # type: ignore[operator]


def test_checker_rejects_a_type_that_cannot_run_the_job() -> None:
    problem = TaskProblem(jobs=(job("a", {FAST: 1.0}),), gpus=(gpu("f", FAST), gpu("s", SLOW)))
    bad = TaskSchedule((Task(JobId("a"), 0, 0, GpuId("s"), 0.0, 1.0),))
    with pytest.raises(ValueError, match=r"\(5\).*type k80, which cannot run it"):
        check_schedule(problem, bad)


# -------------------------------------------------------------------- macro


def gpu_time(j: TaskJob, t: GpuType) -> float:
    return j.remaining_rounds * j.tasks_per_round * j.compute_s[t]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(0, 10**5), st.integers(1, 16)),
                min_size=1, max_size=40),
       st.integers(1, 20_000))
def test_macro_rule_budget_gpu_time_and_round_cover(
    shapes: list[tuple[int, int, int]], budget: int,
) -> None:
    jobs = tuple(job(f"j{n}", {FAST: 0.25, SLOW: 1.5}, rounds=r + d, done_rounds=d, tasks=s,
                     sync_s={FAST: 0.125})
                 for n, (r, d, s) in enumerate(shapes))
    macros = group(jobs, budget)
    q = rounds_per_macro(jobs, budget)
    slots = sum(j.tasks_per_round for j in jobs)
    assert q == max(1, budget // slots)
    assert sum(m.job.remaining_rounds * m.job.tasks_per_round for m in macros) \
        <= max(budget, slots)
    for real, m in zip(jobs, macros, strict=True):
        assert m.job.id == real.id and m.k == math.ceil(real.remaining_rounds / q)
        assert m.job.remaining_rounds <= q
        for t in (FAST, SLOW):
            assert gpu_time(m.job, t) == pytest.approx(gpu_time(real, t), rel=1e-12)
        covered = [r for mr in range(m.job.rounds) for r in m.real_rounds_of(mr)]
        assert covered == list(range(real.done_rounds, real.rounds))
        assert max(len(m.real_rounds_of(mr)) for mr in range(m.job.rounds)) <= m.k


def test_macro_is_the_identity_when_the_problem_fits() -> None:
    problem = TaskProblem(jobs=(job("a", {FAST: 1.0}, rounds=7, done_rounds=2, tasks=3),
                                job("b", {FAST: 2.0}, rounds=5, tasks=2)),
                          gpus=(gpu("g", FAST),))
    grouped, macros = macro_problem(problem, budget=25)
    assert [m.k for m in macros] == [1, 1] and [m.scale for m in macros] == [1.0, 1.0]
    assert [j.compute_s for j in grouped.jobs] == [{FAST: 1.0}, {FAST: 2.0}]
    # One task fewer: Q = 4, so 5 rounds need K = 2, in 3 macro-rounds of 5/3.
    b = group(problem.jobs, budget=24)[1]
    assert (b.k, b.job.rounds, b.scale) == (2, 3, 5 / 3)
    # Budget 10: Q = 2, so a's 5 rounds become 2 macro-rounds of 2.5 on average.
    a = group(problem.jobs, budget=10)[0]
    assert (a.k, a.job.rounds, a.scale, a.job.compute_s) == (3, 2, 2.5, {FAST: 2.5})
    assert [a.real_rounds_of(0), a.real_rounds_of(1)] == [range(2, 4), range(4, 7)]


def test_line_12_breaks_ties_by_speed_unless_told_to_by_gpu_order() -> None:
    # Both GPUs idle at 0, the slow one first in GPU order: one task of one job.
    job = TaskJob(JobId("j"), 0.0, 1, 1, {GpuType("S"): 3.0, GpuType("F"): 1.0})
    problem = TaskProblem((job,), (Gpu(GpuId("s0"), GpuType("S")), Gpu(GpuId("f0"), GpuType("F"))))
    fastest = HarePolicy().schedule(problem)
    by_order = HarePolicy(HareSettings(ties="order")).schedule(problem)
    assert [t.gpu for t in fastest.tasks] == ["f0"]
    assert [t.gpu for t in by_order.tasks] == ["s0"]
    assert HarePolicy(HareSettings(ties="order")).name == "hare:ties=order"
    with pytest.raises(ValueError, match="ties must be one of"):
        HareSettings(ties="random")  # type: ignore[arg-type]
