"""Issue 38's departures from the paper's planner (Eq. 11 and the fill
plans of §3.6), each a ``HopsSettings`` knob that is off by default:
``gain_per_gpu``, ``move_min_gain``, ``keep_in_place_partial``,
``reserve_head``, ``finish_exempt``. Each test shows the plan the paper's objective
gives and the one the setting gives instead."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.policies.hops.classes import pin_kept
from scheduling.policies.hops.exempt import finishing
from scheduling.policies.hops.formulation import class_space, decode
from scheduling.policies.hops.passes import PassJob, SolverSettings, solve_pass
from scheduling.policies.hops.policy import HopsPolicy, HopsSettings
from scheduling.policies.hops.reserve import Reservation, backfill, reserve
from scheduling.registry.grammar import parse_policy
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import sensitivity
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import JobState, Snapshot
from tests.helpers import cluster, flat_estimate, state

EXACT = SolverSettings(mip_rel_gap=0.0, accept_gap=0.0)


def pass_job(name: str, reqs: tuple[int, ...], per_gpu: dict[str, float],
             current: dict[str, int] | None = None) -> PassJob:
    est = flat_estimate(name, per_gpu)
    return PassJob(JobId(name), 1.0, reqs, {GpuType(t): sensitivity(est, GpuType(t))
                                            for t in per_gpu}, est,
                   current=Configuration.of(current) if current else None)


def types_of(c: Cluster, config: Configuration | None) -> set[str]:
    assert config is not None
    return {str(c.by_id[s].gpu_type) for s in config.servers}


# --- gain_per_gpu -----------------------------------------------------------------


def test_gain_per_gpu_weighs_a_speed_up_by_the_gpus_it_makes_faster() -> None:
    # One fast (F) and one slow (S) 8-GPU server. The 8-GPU job runs 1.5x
    # as fast on F, each 1-GPU job 1.1x. Eq. (11) counts G once per job:
    # F to the eight 1-GPU jobs (8 * 1.1 + 1 = 9.8 against 1.5 + 8 = 9.5).
    # Per GPU the wide job's speed-up is 0.5 against 0.1: F to the wide job.
    c = cluster([("F", 1, 8), ("S", 1, 8)])
    free = {s.id: 8 for s in c.servers}
    jobs = [pass_job("wide", (8,), {"F": 150.0, "S": 100.0})]
    jobs += [pass_job(f"one{i}", (1,), {"F": 110.0, "S": 100.0}) for i in range(8)]
    paper = solve_pass(c, free, jobs, EXACT)
    per_gpu = solve_pass(c, free, jobs, msgspec.structs.replace(EXACT, gain_per_gpu=True))
    assert len(paper.choices) == len(per_gpu.choices) == 9
    assert types_of(c, paper.choices[0].config) == {"S"}
    assert types_of(c, per_gpu.choices[0].config) == {"F"}


# --- move_min_gain ----------------------------------------------------------------


@pytest.mark.parametrize(("faster", "floor", "moves"), [
    (102.0, 0.0, True),    # Eq. (11): any gain moves it
    (102.0, 0.05, False),  # 2% is below the 5% floor: it stays
    (110.0, 0.05, True),   # 10% clears it
])
def test_move_min_gain_moves_a_running_job_only_for_that_gain(
    faster: float, floor: float, moves: bool
) -> None:
    c = cluster([("A", 1, 8), ("B", 1, 8)])
    free = {s.id: 8 for s in c.servers}
    job = pass_job("run", (4,), {"A": 100.0, "B": faster}, current={"A-0": 4})
    result = solve_pass(c, free, [job], msgspec.structs.replace(EXACT, move_min_gain=floor))
    assert types_of(c, result.choices[0].config) == ({"B"} if moves else {"A"})


# --- keep_in_place_partial --------------------------------------------------------


def three_fours() -> tuple[Cluster, dict[ServerId, int], list[PassJob]]:
    c = cluster([("A", 2, 8)])
    jobs = [pass_job("a", (4,), {"A": 100.0}, current={"A-0": 4}),
            pass_job("b", (4,), {"A": 100.0}, current={"A-1": 4}),
            pass_job("c", (4,), {"A": 100.0})]
    return c, {s.id: 8 for s in c.servers}, jobs


def test_keep_in_place_partial_keeps_both_running_jobs_on_their_servers() -> None:
    # The class solution packs "a" and "b" onto one pattern instance; the
    # relabelling can send only one of them back: "b" lands on A-0 beside
    # "a", a restart for nothing. Pinned, both stay and "c" takes the rest.
    c, free, jobs = three_fours()
    space = class_space(c, free, jobs, 1.4, 1000)
    assert space is not None
    x = [1.0] * len(space.options) + [0.0] * len(space.pattern_col)
    for (_, pattern), col in space.pattern_col.items():
        x[col] = 2.0 if pattern == ((4, False), (4, False)) else 0.0
    current = {i: j.current for i, j in enumerate(jobs) if j.current is not None}
    relabelled = decode(space, x, current)
    pinned = decode(space, x, current, pin=True)
    assert relabelled[1][1] != jobs[1].current  # the twin-server move
    assert pinned[0][1] == jobs[0].current and pinned[1][1] == jobs[1].current
    used: Counter[ServerId] = Counter()
    for _, config in pinned.values():
        used.update(config.as_dict())
    assert all(used[s] <= free[s] for s in used) and sum(used.values()) == 12


def test_pin_kept_gives_way_when_the_others_no_longer_fit() -> None:
    # "c" needs a whole server: with "a" and "b" on their own servers there
    # is none, so the class keeps the pattern realisation (None here).
    c, free, jobs = three_fours()
    jobs[2] = pass_job("c", (8,), {"A": 100.0})
    space = class_space(c, free, jobs, 1.4, 1000)
    assert space is not None
    demands = [o.klass for o in space.options if o.klass is not None and o.gpus in (4, 8)]
    wanted = [jobs[0].current, jobs[1].current, None]
    assert pin_kept(space.classes[0], demands, wanted) is None


# --- finish_exempt ----------------------------------------------------------------


def near_its_end(left: float, restart_s: float = 0.0, first_plan: bool = True) -> Snapshot:
    """One 4-GPU server. "run" holds it at 361 samples/s (4 x 100 x 0.95^2)
    with ``left`` samples to go, long past its recent-restart exemption;
    "wait" needs the whole server and has waited 5,000 s."""
    c = cluster([("A", 1, 4)])
    run = msgspec.structs.replace(state("run", [4], samples=1_000_000), phase="running",
                                  done_samples=1_000_000 - left, restart_s=restart_s,
                                  current=Configuration.of({"A-0": 4}), throughput_since=10.0)
    jobs = (run, state("wait", [4], wait_s=5000.0))
    held = {} if first_plan else {ServerId("A-0"): 4}
    return Snapshot(now=10_000.0, cluster=c, jobs=jobs, first_plan=first_plan, held=held,
                    estimates={j.id: flat_estimate(j.id, {"A": 100.0}) for j in jobs})


@pytest.mark.parametrize(("left", "restart_s", "kept"), [
    (36_100.0, 0.0, True),    # 100 s left, a preemption costs 30 + 300 s: it ends first
    (118_000.0, 0.0, True),   # 327 s left < 330 s
    (120_000.0, 0.0, False),  # 332 s left: the waiting job takes the server
    (120_000.0, 60.0, True),  # a 60 s restart: 360 s, so 332 s left is kept
    (361_000.0, 0.0, False),  # 1,000 s left
])
def test_finish_exempt_keeps_a_job_that_ends_before_a_preemption_would_pay(
    left: float, restart_s: float, kept: bool
) -> None:
    snap = near_its_end(left, restart_s)
    paper = HopsPolicy().plan(snap)
    assert paper.config_of(JobId("wait")) == Configuration.of({"A-0": 4})  # preempted
    plan = HopsPolicy(HopsSettings(finish_exempt=True)).plan(snap)
    winner = JobId("run") if kept else JobId("wait")
    assert [a.job_id for a in plan.assignments] == [winner]
    assert finishing(snap, snap.jobs[0]) == kept


@given(left=st.floats(1.0, 1_000_000.0), restart_s=st.floats(0.0, 300.0),
       first_plan=st.booleans())
def test_finish_exempt_changes_only_plans_with_a_job_near_its_end(
    left: float, restart_s: float, first_plan: bool
) -> None:
    # A job whose remaining time is under its restart cost (30 s when not
    # known) plus a round keeps its GPUs at a first plan; any other plan is
    # the one without the setting (its solve times apart).
    snap = near_its_end(left, restart_s, first_plan)
    plan = HopsPolicy(HopsSettings(finish_exempt=True)).plan(snap)
    ends_first = left / 361.0 < (restart_s or 30.0) + 300.0
    if first_plan and ends_first:
        assert plan.config_of(JobId("run")) == Configuration.of({"A-0": 4})
    else:
        assert plan.assignments == HopsPolicy().plan(snap).assignments


# --- the specs --------------------------------------------------------------------


def test_the_settings_are_policy_specs_with_issue_38s_defaults() -> None:
    spec = parse_policy("hops:gain_per_gpu=true,move_min_gain=0.1,keep_in_place_partial=false")
    assert isinstance(spec, HopsSettings)
    solver = spec.solver()
    assert (solver.gain_per_gpu, solver.move_min_gain, solver.keep_in_place_partial) == (
        True, 0.1, False)
    default = HopsSettings()  # docs/results.md, "Issue 38: the default"
    assert (default.priority, default.gain_per_gpu, default.move_min_gain,
            default.keep_in_place_partial, default.reserve_head) == (
        "guarded-delay", False, 0.05, True, False)
    assert default.solver() == SolverSettings(sigma=default.sigma)
    paper = parse_policy("hops-paper")
    assert isinstance(paper, HopsSettings)
    assert (paper.priority, paper.move_min_gain, paper.keep_in_place_partial) == (
        "lr", 0.0, False)
    assert parse_policy("hops:reserve_head=true").reserve_head  # type: ignore[union-attr]
    assert parse_policy("hops:finish_exempt=true").finish_exempt  # type: ignore[union-attr]
    assert not default.finish_exempt
    with pytest.raises(ValueError, match="move_min_gain"):
        HopsSettings(move_min_gain=1.0)


# --- reserve_head -----------------------------------------------------------------


def later_in_the_round(other: JobState) -> Snapshot:
    """Two 4-GPU servers; "run" holds A-0 for about 100 s more, A-1 is idle.
    The head of the queue needs all 8 GPUs; ``other`` (4 GPUs) fits now."""
    c = cluster([("A", 2, 4)])
    run = msgspec.structs.replace(state("run", [4], samples=36_100), phase="running",
                                  current=Configuration.of({"A-0": 4}))
    wide = state("wide", [8], wait_s=5000.0)
    jobs = (run, wide, other)
    return Snapshot(now=1000.0, cluster=c, jobs=jobs, first_plan=False,
                    held={ServerId("A-0"): 4},
                    estimates={j.id: flat_estimate(j.id, {"A": 100.0}) for j in jobs})


@pytest.mark.parametrize(("samples", "reserved_starts"), [
    (3_610_000, False),  # ~10,000 s: it would hold A-1 past the head's shadow time
    (18_000, True),      # ~50 s: it ends before "run" does, and is backfilled
])
def test_reserve_head_backfills_only_jobs_that_end_before_the_head_can_start(
    samples: int, reserved_starts: bool
) -> None:
    snap = later_in_the_round(state("other", [4], wait_s=10.0, samples=samples))
    other = JobId("other")
    assert HopsPolicy().plan(snap).config_of(other) is not None  # §3.6: whatever fits now
    reserved = HopsPolicy(HopsSettings(reserve_head=True)).plan(snap)
    assert (reserved.config_of(other) is not None) == reserved_starts
    assert reserved.config_of(JobId("wide")) is None


def test_no_reservation_when_the_head_fits_or_never_can() -> None:
    c = cluster([("A", 2, 4)])
    free = {ServerId("A-0"): 4, ServerId("A-1"): 0}
    head = state("wide", [8])
    est = flat_estimate("wide", {"A": 100.0})
    ends = [(1100.0, Configuration.of({"A-1": 4}))]
    got = reserve(head, est, 8, c, free, ends, now=1000.0)
    assert got is not None and (got.gpu_type, got.until) == (GpuType("A"), 1100.0)
    assert reserve(head, est, 8, c, free, [], now=1000.0) is None  # never 8 free
    assert reserve(head, est, 4, c, free, ends, now=1000.0) is None  # 4 idle now


def test_backfill_strips_the_reserved_type_only_from_waiting_jobs_that_would_overrun() -> None:
    """A waiting job whose run on the reserved type would end after the
    head's shadow time loses that type; a short one keeps it; so does a
    running job a first plan left without GPUs, however long (its restart
    cost is read off its speed where it runs: stripping that type crashed
    the reconfiguration cost)."""
    c = cluster([("A", 2, 4), ("B", 1, 4)])
    long_wait = state("long", [4], samples=3_610_000)
    short_wait = state("short", [4], samples=18_000)
    running = msgspec.structs.replace(state("run", [4], samples=3_610_000), phase="running",
                                      current=Configuration.of({"A-0": 4}))
    jobs = {j.id: j for j in (long_wait, short_wait, running)}
    ests = {j: flat_estimate(j, {"A": 100.0, "B": 50.0}) for j in jobs}
    got = backfill(Reservation(JobId("wide"), GpuType("A"), 1100.0), 1000.0, c, jobs, ests, 4)
    assert set(got[JobId("long")].by_type) == {GpuType("B")}
    assert not any(s.startswith("A-") for s in got[JobId("long")].by_server)
    assert got[JobId("short")] == ests[JobId("short")]
    assert got[JobId("run")] == ests[JobId("run")]
