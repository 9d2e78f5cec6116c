"""The Themis baseline: rho and its ordering, the 1 - f offer, the partial
allocation on a tiny auction, leases, later plans, and over random
clusters a plan that fits the free GPUs and is the same every time; a
short simulation runs to the end."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.common.simrun import RunSpec, simulate
from scheduling.policies.themis import fairness
from scheduling.policies.themis.auction import Bid, kept, partial_shares, proportional_fair
from scheduling.policies.themis.leases import STATE, Leases, decode, encode
from scheduling.registry import make_policy, parse_policy
from shared.configuration import Configuration
from shared.ids import GpuType, JobId
from shared.snapshot import JobState, Plan, Snapshot
from simulator.metrics import summarize
from tests.helpers import assert_feasible, cluster, flat_estimate, held_by, state

A = GpuType("A")


def job(jid: str, gpus: int, *, submit: float = 0.0, samples: int = 1_000_000,
        running_on: dict[str, int] | None = None) -> JobState:
    base = state(jid, [gpus], submit=submit, samples=samples)
    if running_on is None:
        return base
    return msgspec.structs.replace(base, phase="running", current=Configuration.of(running_on))


def snap(layout: list[tuple[str, int, int]], jobs: Sequence[JobState], now: float = 0.0,
         leases: dict[str, float] | None = None, first: bool = True,
         speed: dict[str, float] | None = None) -> Snapshot:
    c = cluster(layout)
    held = {} if first else held_by(jobs)
    per_gpu = speed or {t.name: 100.0 for t in c.gpu_types}
    ests = {j.id: flat_estimate(j.id, per_gpu) for j in jobs}
    blob = encode(Leases({JobId(k): v for k, v in (leases or {}).items()}))
    return Snapshot(now=now, cluster=c, jobs=tuple(jobs), estimates=ests, held=held,
                    first_plan=first, layer_state={STATE: blob})


def plan_of(s: Snapshot, spec: str = "themis") -> Plan:
    plan = make_policy(spec).plan(s)
    assert_feasible(plan, s)
    return plan


def configs(plan: Plan) -> dict[str, str]:
    return {a.job_id: str(a.config) for a in plan.assignments}


def leases_after(plan: Plan) -> dict[JobId, float]:
    return next(decode(r.state).since for r in plan.reasons.layers if r.name == STATE)


# --- rho ---------------------------------------------------------------------------


def test_rho_is_the_shared_finish_time_over_the_fair_share_one() -> None:
    # 1000 samples at 10/s: alone on its share (4 GPUs, 2 jobs: 2 GPUs
    # each, its request of 1 fits) T_id = 100 s. Waiting 100 s so far and
    # 100 s of work left: T_sh = 200 s, rho = 2.
    waited = fairness.Standing(elapsed_s=100.0, total=1000.0, remaining=1000.0,
                               request_rate=10.0, current_rate=0.0)
    x_id = fairness.fair_rate(10.0, 1, total_gpus=4, contenders=2)
    assert x_id == 10.0 and fairness.rho(waited, x_id) == pytest.approx(2.0)
    # A request of 4 on a share of 2 time-shares: half the speed, T_id twice.
    assert fairness.fair_rate(10.0, 4, total_gpus=4, contenders=2) == 5.0
    # Running at twice the request speed with half its work left: 100 + 25.
    fast = dataclasses.replace(waited, remaining=500.0, current_rate=20.0)
    assert fairness.rho(fast, x_id) == pytest.approx(1.25)
    # Furthest from fair first; equal rho by arrival.
    order = fairness.ranked({"fast": 1.5, "waited": 2.0, "late": 1.5},
                            {"fast": 0.0, "waited": 5.0, "late": 3.0})
    assert order == ["waited", "fast", "late"]


def test_a_bundle_is_worth_the_lease_it_saves() -> None:
    s = fairness.Standing(elapsed_s=100.0, total=1000.0, remaining=1000.0,
                          request_rate=10.0, current_rate=0.0)
    # Without it: 100 + 600 (a lease lost) + 100; with it at 20/s: 100 + 50.
    assert fairness.value(s, 20.0, 0.0, 600.0) == pytest.approx(800.0 / 150.0)
    assert fairness.value(s, 0.0, 0.0, 600.0) == 0.0


def test_the_plan_reports_rho_and_ranks_the_waiting_first() -> None:
    # One server of 4 for three 4-GPU jobs: old waited longest, run holds
    # the GPUs at a lease that ended, half done. old has the highest rho
    # and wins.
    run = msgspec.structs.replace(job("run", 4, submit=0.0, running_on={"A-0": 4}),
                                  done_samples=500_000.0)
    old, new = job("old", 4, submit=0.0), job("new", 4, submit=900.0)
    plan = plan_of(snap([("A", 1, 4)], [run, old, new], now=1000.0, leases={"run": 0.0}))
    rho = plan.reasons.priorities
    assert rho["old"] > rho["new"] and rho["old"] > rho["run"]
    assert configs(plan) == {"old": "{A-0:4}"}


# --- the offer and the auction ---------------------------------------------------


def test_the_auction_is_offered_to_the_1_minus_f_fraction_furthest_from_fair() -> None:
    jobs = [job(f"j{i}", 1, submit=float(i)) for i in range(10)]
    s = snap([("A", 1, 4)], jobs, now=100.0)
    label = plan_of(s).reasons.passes[0].formulation
    assert "bidders=2/10" in label  # f = 0.8: 1 - f of 10
    assert "bidders=5/10" in plan_of(s, "themis:fairness_knob=0.5").reasons.passes[0].formulation
    assert "bidders=1/10" in plan_of(s, "themis:fairness_knob=1").reasons.passes[0].formulation
    # The first arrived waited longest: highest rho, so the 4 GPUs go to
    # j0..j3 (bidders first, the leftover in rho order).
    assert sorted(configs(plan_of(s))) == ["j0", "j1", "j2", "j3"]


def test_partial_allocation_on_a_tiny_auction() -> None:
    # Three GPUs of A. By log v per GPU: big (ln 4 / 2 = ln 2, and the
    # higher value of the tie) then two (ln 2), then one (ln 1.5).
    big, two, one = (Bid(JobId("big"), A, 2, 4.0), Bid(JobId("two"), A, 1, 2.0),
                     Bid(JobId("one"), A, 1, 1.5))
    pf = proportional_fair([one, two, big], {A: 3})
    assert pf == {"big": big, "two": two}
    shares = partial_shares([one, two, big], {A: 3})
    # Without big, two and one both win: the others' product goes from 2
    # to 3, so big keeps c = 2/3 of its 2 GPUs, which rounds to 1: it
    # gives the bundle back. Without two, big and one win (4 * 1.5 = 6
    # against 4): c = 2/3 of one GPU rounds to it, and two keeps it.
    assert shares["big"][1] == pytest.approx(2 / 3)
    assert shares["two"][1] == pytest.approx(2 / 3)
    assert not kept(big, shares["big"][1]) and kept(two, shares["two"][1])
    # Alone, a winner keeps everything: nobody else is worse off.
    assert partial_shares([big], {A: 2})["big"][1] == 1.0
    # No gain, no bid.
    assert proportional_fair([Bid(JobId("x"), A, 1, 1.0)], {A: 1}) == {}


def test_a_running_bidder_keeps_its_gpus_without_a_restart() -> None:
    # Its lease ended and it is the only job: it wins its own configuration
    # back rather than the consolidated placement elsewhere.
    run = job("run", 2, running_on={"A-1": 2})
    plan = plan_of(snap([("A", 2, 2)], [run], now=1000.0, leases={"run": 0.0}))
    assert configs(plan) == {"run": "{A-1:2}"}


# --- leases and later plans ----------------------------------------------------------


def test_a_lease_holds_until_it_ends() -> None:
    # run has made progress: waiting is further from fair, and takes the
    # GPUs once run's lease ends.
    run = msgspec.structs.replace(job("run", 4, submit=0.0, running_on={"A-0": 4}),
                                  done_samples=300_000.0)
    waiting = job("waiting", 4, submit=0.0)
    during = plan_of(snap([("A", 1, 4)], [run, waiting], now=500.0, leases={"run": 0.0}))
    assert configs(during) == {"run": "{A-0:4}"}
    assert leases_after(during) == {"run": 0.0}
    after = plan_of(snap([("A", 1, 4)], [run, waiting], now=600.0, leases={"run": 0.0}))
    assert configs(after) == {"waiting": "{A-0:4}"}
    assert leases_after(after) == {"waiting": 600.0}
    shorter = plan_of(snap([("A", 1, 4)], [run, waiting], now=500.0, leases={"run": 0.0}),
                      "themis:lease_s=300")
    assert configs(shorter) == {"waiting": "{A-0:4}"}


def test_a_later_plan_offers_only_the_free_gpus_to_the_waiting() -> None:
    # run keeps its GPUs. Of the waiting, one is further from fair: on a
    # share of 8/3 GPUs, wide's request of 4 would time-share, so its T_id
    # is longer and its rho lower. one bids alone (1 - f of two jobs) and
    # wins; wide no longer fits the 3 GPUs left.
    run = job("run", 4, running_on={"A-0": 4})
    jobs = [run, job("wide", 4, submit=1.0), job("one", 1, submit=2.0)]
    plan = plan_of(snap([("A", 2, 4)], jobs, now=100.0, leases={"run": 0.0}, first=False))
    assert plan.reasons.priorities["one"] > plan.reasons.priorities["wide"]
    assert configs(plan) == {"one": "{A-1:1}"}
    assert leases_after(plan) == {"run": 0.0, "one": 100.0}


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="fairness_knob"):
        parse_policy("themis:fairness_knob=1.5")
    with pytest.raises(ValueError, match="lease_s"):
        parse_policy("themis:lease_s=0")
    with pytest.raises(ValueError, match="takes no setting priority"):
        parse_policy("themis:priority=ftf")


# --- over random clusters -------------------------------------------------------------


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[tuple[str, int, int]], list[JobState], Snapshot]:
    layout = [("A", draw(st.integers(1, 3)), draw(st.sampled_from([2, 4, 8])))]
    if draw(st.booleans()):
        layout.append(("B", draw(st.integers(1, 2)), draw(st.sampled_from([2, 4]))))
    free = {f"{t}-{n}": g for t, count, g in layout for n in range(count)}
    jobs: list[JobState] = []
    leases: dict[str, float] = {}
    for i in range(draw(st.integers(1, 12))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        sid = draw(st.sampled_from(sorted(free)))
        if free[sid] >= gpus and draw(st.booleans()):
            free[sid] -= gpus
            jobs.append(job(f"j{i}", gpus, submit=float(draw(st.integers(0, 900))),
                            running_on={sid: gpus}))
            if draw(st.booleans()):
                leases[f"j{i}"] = float(draw(st.integers(0, 1000)))
        else:
            jobs.append(job(f"j{i}", gpus, submit=float(draw(st.integers(0, 900))),
                            samples=draw(st.integers(1000, 10_000_000))))
    speed = {"A": 100.0, "B": float(draw(st.sampled_from([50, 100, 300])))}
    s = snap(layout, jobs, now=1000.0, leases=leases, first=draw(st.booleans()),
             speed={t: speed[t] for t, _, _ in layout})
    return layout, jobs, s


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes(), st.sampled_from(["themis", "themis:fairness_knob=0", "themis:fairness_knob=1"]))
def test_never_more_than_the_free_gpus_and_the_same_plan_every_time(
        scene: tuple[list[tuple[str, int, int]], list[JobState], Snapshot], spec: str) -> None:
    _, jobs, s = scene
    plan = plan_of(s, spec)  # assert_feasible: no server beyond its free GPUs
    free = s.free_gpus()
    assert sum(a.config.total_gpus for a in plan.assignments) <= sum(free.values())
    assert make_policy(spec).plan(s) == plan
    # Work-conserving: on one server, a job that could have had GPUs (any
    # job in a first plan, a waiting one in a later) asks for more than
    # the GPUs left idle.
    idle = sum(free.values()) - sum(a.config.total_gpus for a in plan.assignments)
    placed = {a.job_id for a in plan.assignments}
    for j in jobs:
        if j.id not in placed and (s.first_plan or j.phase == "queued"):
            assert j.spec.requirements[0] > idle or len(s.cluster.servers) > 1
    rhos = plan.reasons.priorities
    assert all(math.isfinite(r) and r >= 0 for r in rhos.values())


# --- a short simulation ----------------------------------------------------------------


def test_a_short_simulation_finishes_every_job() -> None:
    used, result = simulate(RunSpec(cluster="paper-sim-512", workload="paper-sim",
                                    policy="themis", first_n=15))
    summary = summarize(result, used)
    assert summary["jobs_finished"] == summary["jobs"] == 15
