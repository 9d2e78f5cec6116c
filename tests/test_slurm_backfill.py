"""The Slurm-style baseline: multifactor priority worked by hand, EASY
backfill on hand-checked queues, no preemption, and the EASY invariant (the
head's reserved GPUs are still free at its start) over random queues."""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.tables.define import POLICIES as TABLE_POLICIES
from experiments.tables.define import define, with_variants
from scheduling.policies.rigid import Avail, give, place, take
from scheduling.policies.slurm.backfill import Running, Waiting, easy_backfill
from scheduling.policies.slurm.policy import (
    DAY_S,
    SlurmPolicy,
    SlurmSettings,
    multifactor,
    size_factor,
    time_limit_s,
)
from scheduling.registry import make_policy, parse_policy
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import JobState, Snapshot
from tests.helpers import assert_feasible, cluster, flat_estimate, state


def job(jid: str, gpus: int, *, limit: float | None = None, submit: float = 0.0,
        running_on: dict[str, int] | None = None, ran_s: float = 0.0) -> JobState:
    """A job of ``gpus`` GPUs with time limit ``limit``; running on
    ``running_on`` for ``ran_s`` seconds when given."""
    base = state(jid, [gpus], submit=submit)
    spec = msgspec.structs.replace(base.spec, time_limit=limit)
    if running_on is None:
        return msgspec.structs.replace(base, spec=spec)
    return msgspec.structs.replace(base, spec=spec, phase="running",
                                   current=Configuration.of(running_on),
                                   attained_gpu_s=ran_s * gpus)


def snap(layout: list[tuple[str, int, int]], jobs: Sequence[JobState], now: float = 0.0,
         first: bool = True) -> Snapshot:
    c = cluster(layout)
    held: dict[ServerId, int] = {}
    if not first:  # a later plan: running jobs hold their GPUs
        for j in jobs:
            if j.current is not None:
                for s, g in j.current.parts:
                    held[s] = held.get(s, 0) + g
    ests = {j.id: flat_estimate(j.id, {t.name: 100.0 for t in c.gpu_types}) for j in jobs}
    return Snapshot(now=now, cluster=c, jobs=tuple(jobs), estimates=ests, held=held,
                    first_plan=first)


def configs(s: Snapshot, spec: str = "slurm") -> dict[str, str]:
    plan = make_policy(spec).plan(s)
    assert_feasible(plan, s)
    return {a.job_id: str(a.config) for a in plan.assignments}


# --- multifactor priority --------------------------------------------------------


def test_age_and_size_factors_by_hand() -> None:
    s = SlurmSettings()
    j = job("j", 8, submit=0.0)
    # 7 days of 14 -> age 0.5; 8 GPUs of 512 -> size 1/64.
    assert multifactor(j, 8, 7 * DAY_S, 512, s) == pytest.approx(1000 * 0.5 + 1000 / 64)
    # The age factor stops at PriorityMaxAge.
    assert multifactor(j, 8, 30 * DAY_S, 512, s) == pytest.approx(1000 + 1000 / 64)
    assert size_factor(512, 512, False) == 1.0
    assert size_factor(1, 512, True) == 1.0 and size_factor(512, 512, True) == 1 / 512


def test_a_larger_job_goes_first_and_favor_small_turns_it_round() -> None:
    jobs = [job("small", 1, submit=0.0), job("wide", 4, submit=10.0)]
    s = snap([("A", 1, 4)], jobs, now=20.0)
    assert configs(s) == {"wide": "{A-0:4}"}
    assert configs(s, "slurm:favor_small=true") == {"small": "{A-0:1}"}


def test_the_time_limit_is_the_users_else_the_predicted_run_on_the_slowest_type() -> None:
    c = cluster([("A", 1, 4), ("B", 1, 4)])
    est = flat_estimate("j", {"A": 100.0, "B": 50.0})
    types = (GpuType("A"), GpuType("B"))
    assert time_limit_s(job("j", 1, limit=600.0), est, c, 1, types, 1.0) == 600.0
    # 1e6 samples at 50/s on one B GPU.
    assert time_limit_s(job("j", 1), est, c, 1, types, 2.0) == pytest.approx(2 * 20_000)
    assert math.isinf(time_limit_s(job("j", 1), est, c, 1, (), 1.0))


# --- EASY backfill, by hand ------------------------------------------------------


def test_the_head_is_reserved_and_only_a_job_that_ends_before_it_backfills() -> None:
    # A-0 runs r until t = 1000; the 8-GPU head waits for it. A 2-GPU job
    # whose limit ends by 1000 may use A-1 now; one that runs longer would
    # hold GPUs the head needs at 1000, and waits.
    jobs = [job("r", 4, limit=1000.0, running_on={"A-0": 4}),
            job("head", 8, limit=100.0, submit=0.0),
            job("long", 2, limit=5000.0, submit=1.0),
            job("short", 2, limit=900.0, submit=2.0)]
    s = snap([("A", 2, 4)], jobs)
    plan = make_policy("slurm").plan(s)
    assert {a.job_id: str(a.config) for a in plan.assignments} == {
        "r": "{A-0:4}", "short": "{A-1:2}"}
    assert plan.reasons.passes[0].formulation == (
        "slurm-easy-backfill, reservation=head@1000s, backfilled=1")


def test_a_long_job_backfills_onto_the_gpus_the_reservation_leaves_over() -> None:
    # At t = 1000 the head takes A-0 and A-2 (fewest servers, largest first);
    # A-1's two free GPUs are spare: the first long job takes them, the
    # second may not take A-2's, though they are free now.
    jobs = [job("r1", 4, limit=1000.0, running_on={"A-0": 4}),
            job("r2", 2, limit=9000.0, running_on={"A-1": 2}),
            job("head", 8, limit=100.0),
            job("long1", 2, limit=5000.0, submit=1.0),
            job("long2", 2, limit=5000.0, submit=2.0)]
    got = configs(snap([("A", 3, 4)], jobs))
    assert got == {"r1": "{A-0:4}", "r2": "{A-1:2}", "long1": "{A-1:2}"}


def test_without_backfill_the_pass_stops_at_the_head() -> None:
    jobs = [job("r", 4, limit=1000.0, running_on={"A-0": 4}),
            job("head", 8, limit=100.0), job("short", 2, limit=900.0, submit=2.0)]
    assert configs(snap([("A", 2, 4)], jobs), "slurm:backfill=false") == {"r": "{A-0:4}"}


def test_a_job_that_can_never_run_blocks_nobody() -> None:
    jobs = [job("huge", 16, limit=100.0), job("one", 1, limit=100.0, submit=1.0)]
    assert configs(snap([("A", 2, 4)], jobs)) == {"one": "{A-0:1}"}


def test_running_jobs_are_never_preempted_and_a_later_plan_only_adds() -> None:
    jobs = [job("low", 4, limit=10.0, running_on={"A-0": 4}, submit=100.0),
            job("high", 8, limit=10.0, submit=0.0), job("one", 1, limit=5.0, submit=1.0)]
    first = configs(snap([("A", 2, 4)], jobs, now=50.0))
    assert first == {"low": "{A-0:4}", "one": "{A-1:1}"}
    later = configs(snap([("A", 2, 4)], jobs, now=50.0, first=False))
    assert later == {"one": "{A-1:1}"}


def test_a_job_whose_gpus_went_down_is_requeued() -> None:
    jobs = [job("r", 4, limit=100.0, running_on={"A-0": 4})]
    s = msgspec.structs.replace(snap([("A", 2, 4)], jobs), held={ServerId("A-0"): 4})
    assert configs(s) == {"r": "{A-1:4}"}


def test_one_gpu_type_per_job_any_type_and_no_setting_it_does_not_take() -> None:
    jobs = [job("j", 6, limit=100.0)]  # 4 free on A, 4 on B: no single type holds 6
    assert configs(snap([("A", 1, 4), ("B", 1, 4)], jobs)) == {}
    assert configs(snap([("A", 1, 4), ("B", 2, 4)], jobs)) == {"j": "{B-0:4, B-1:2}"}
    with pytest.raises(ValueError, match="takes no setting priority"):
        parse_policy("slurm:priority=lr")
    assert SlurmPolicy(SlurmSettings(limit_factor=2.0)).settings.limit_factor == 2.0


def test_placement_is_best_fit_across_types_never_by_speed() -> None:
    # B-0 has one GPU left: a one-GPU job fills it rather than open A-0,
    # whatever the types' speeds; a two-GPU job goes to A-0.
    jobs = [job("r", 3, limit=100.0, running_on={"B-0": 3}),
            job("one", 1, limit=10.0, submit=1.0), job("two", 2, limit=10.0, submit=2.0)]
    got = configs(snap([("A", 1, 4), ("B", 1, 4)], jobs))
    assert got == {"r": "{B-0:3}", "two": "{A-0:2}", "one": "{B-0:1}"}


# --- the EASY invariant ------------------------------------------------------------


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Avail, list[Running], list[Waiting], int]:
    servers = draw(st.integers(1, 4))
    size = draw(st.sampled_from([2, 4, 8]))
    avail: Avail = {ServerId(f"A-{i}"): size for i in range(servers)}
    running: list[Running] = []
    for i in range(draw(st.integers(0, 5))):
        s = ServerId(f"A-{draw(st.integers(0, servers - 1))}")
        g = draw(st.integers(1, size))
        if avail[s] >= g:
            avail[s] -= g
            end = float(draw(st.integers(0, 100)))
            running.append(Running(JobId(f"r{i}"), Configuration.of({s: g}), end))
    queue = [Waiting(JobId(f"q{i}"), draw(st.integers(1, servers * size)),
                     float(draw(st.integers(1, 200))))
             for i in range(draw(st.integers(1, 8)))]
    return avail, running, queue, size


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_backfilled_jobs_never_take_the_heads_reserved_gpus(
        scene: tuple[Avail, list[Running], list[Waiting], int]) -> None:
    avail, running, queue, size = scene
    c = cluster([("A", len(avail), size)])
    est = flat_estimate("x", {"A": 100.0})

    def placer(w: Waiting, free: Avail) -> Configuration | None:
        return place(c, w.gpus, free, (GpuType("A"),), est)

    out = easy_backfill(queue, avail, running, 0.0, placer)
    now_free = dict(avail)
    for cfg in out.started.values():
        take(now_free, cfg)
    assert all(g >= 0 for g in now_free.values())  # nothing booked twice
    res = out.reservation
    if res is None:
        return
    # Free at the head's start: what is free now, plus what ends by then.
    limits = {w.job_id: w.limit_s for w in queue}
    at_start = dict(now_free)
    for r in running:
        if r.end <= res.start:
            give(at_start, r.config)
    for jid, cfg in out.started.items():
        if limits[jid] <= res.start:
            give(at_start, cfg)
    for s, g in res.config.parts:
        assert at_start[s] >= g, (s, at_start, res)
    # Every job that started ahead of the head fitted in priority order; the
    # head itself did not fit now.
    assert res.job_id not in out.started


# --- selectable in the experiments -------------------------------------------------


def test_traces_and_table4_take_both_baselines_by_policy_and_by_variant() -> None:
    exp = define("traces", trace="elasticflow-cluster01", first_n=50,
                 policies=("hops", "slurm", "tiresias"))
    assert [label for label, _ in exp.runs] == [
        "cluster01/hops", "cluster01/slurm", "cluster01/tiresias"]
    t4 = define("table4", policies=with_variants(TABLE_POLICIES, ("slurm", "tiresias")))
    assert [label for label, _ in t4.runs][-2:] == ["slurm", "tiresias"]
    with pytest.raises(ValueError, match="takes no setting"):
        define("table4", policies=("slurm:lam=2",))


def test_traces_and_table4_compare_them_by_default_the_rest_do_not() -> None:
    exp = define("traces", trace="elasticflow-cluster01", first_n=50)
    assert [label for label, _ in exp.runs] == [
        f"cluster01/{p}" for p in ("hops", "sia", "gavel", "slurm", "tiresias", "themis")]
    assert [label for label, _ in define("table4").runs] == [
        "hops", "sia", "gavel", "slurm", "tiresias", "themis"]
    assert [label for label, _ in define("table3").runs] == ["hops", "sia", "gavel"]
