"""Forecasts (scheduling.forecast): determinism, a lone job's start and
finish against the ground truth, intervals, positions, what-ifs, the
online calibration, and the simulator's opt-in records."""

from __future__ import annotations

import random

import msgspec
import pytest

from bench.synthetic import make_cluster, make_queue
from scheduling.forecast import (
    Calibration,
    Interval,
    apply,
    forecast,
    observe,
    track,
    with_known_misses,
)
from scheduling.policies.hops.policy import HopsPolicy
from scheduling.registry import make_policy, resolve
from scheduling.rounds import RESTART_S, ROUND_S
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.snapshot import Assignment, JobState, Plan, PlanReasons, Snapshot
from simulator.engine import Simulation
from simulator.settings import SimSettings
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.truth import GroundTruth

MODEL = "resnet18-cifar10"
RTX = GpuType("RTX3090")
NOW = 1000.0


def cluster(servers: int = 1, gpus: int = 4) -> Cluster:
    return Cluster(
        gpu_types=(GpuTypeSpec(RTX, link_bandwidth=2.5e9, net_bandwidth=1e9),),
        servers=tuple(Server(ServerId(f"n{i}"), RTX, gpus, model="TIGERWAY YK8100-8G")
                      for i in range(servers)),
    )


def spec(jid: str, reqs: tuple[int, ...], samples: float, tenant: str = "default",
         submit: float = 0.0) -> JobSpec:
    return JobSpec(id=JobId(jid), model=MODEL, batch_size=256, params=11_181_642,
                   total_samples=int(samples), requirements=reqs, submit_time=submit,
                   tenant=TenantId(tenant))


def flat(jid: str, per_gpu: float) -> JobEstimate:
    """Perfect scaling at ``per_gpu`` samples/s per GPU, on one or more nodes."""
    return JobEstimate(JobId(jid), {RTX: ThroughputCurve((per_gpu,) * 8, (per_gpu,) * 7)})


def synthetic() -> tuple[Snapshot, Plan]:
    rng = random.Random(3)
    c = make_cluster(rng, 64)
    queue, estimates = make_queue(rng, c)
    snap = Snapshot(now=NOW, cluster=c, jobs=tuple(queue), estimates=estimates)
    return snap, HopsPolicy().plan(snap)


def test_deterministic_for_a_seed_and_the_seed_matters() -> None:
    snap, plan = synthetic()
    a = forecast(snap, plan, round_s=ROUND_S, seed=7)
    b = forecast(snap, plan, round_s=ROUND_S, seed=7)
    assert msgspec.json.encode(a) == msgspec.json.encode(b)
    c = forecast(snap, plan, round_s=ROUND_S, seed=8)
    assert [f.finish_hi for f in a.jobs] != [f.finish_hi for f in c.jobs]


def test_intervals_hold_the_point_and_finish_follows_start() -> None:
    snap, plan = synthetic()
    out = forecast(snap, plan, round_s=ROUND_S)
    assert out.jobs and any(f.position > 0 for f in out.jobs)
    for f in out.jobs:
        assert f.start_lo <= f.start <= f.start_hi
        assert f.finish_lo <= f.finish <= f.finish_hi
        assert NOW - 1e-9 <= f.start <= f.finish


def test_a_lone_assigned_job_starts_now_and_finishes_within_the_estimators_error() -> None:
    # The estimate is 10% below the ground truth's rate: the forecast's
    # finish is off by at most that error, and its interval (the default
    # sigma while nothing is measured) holds the true finish.
    c = cluster()
    truth = GroundTruth(c, builtin_catalog())
    config = Configuration.of({"n0": 4})
    rate = truth.throughput(MODEL, config)
    samples = rate * 3600
    est = flat("a", 0.9 * rate / 4)
    job = JobState(spec=spec("a", (1, 2, 4), samples))
    snap = Snapshot(now=NOW, cluster=c, jobs=(job,), estimates={JobId("a"): est})
    plan = Plan(assignments=(Assignment(JobId("a"), config),))
    (f,) = forecast(snap, plan, round_s=ROUND_S).jobs
    true_finish = NOW + RESTART_S + int(samples) / rate
    assert f.position == 0 and f.start == NOW
    assert abs(f.finish - true_finish) <= 0.12 * (true_finish - NOW)
    assert f.finish_lo <= true_finish <= f.finish_hi


def test_a_lone_waiting_job_on_an_idle_cluster_starts_at_the_next_plan() -> None:
    c = cluster()
    job = JobState(spec=spec("a", (2, 4), 100 * 3600.0))
    snap = Snapshot(now=NOW, cluster=c, jobs=(job,), estimates={JobId("a"): flat("a", 25.0)})
    (f,) = forecast(snap, Plan(), round_s=ROUND_S).jobs
    assert (f.position, f.tenant_position) == (1, 1)
    assert f.start == NOW + ROUND_S  # the next round's first plan
    assert f.finish == pytest.approx(NOW + ROUND_S + RESTART_S + 100 * 3600.0 / 100.0)


def full_cluster(waiting: list[JobState], priorities: dict[JobId, float],
                 running_s: float = 3600.0, gpus: int = 4) -> tuple[Snapshot, Plan]:
    """One server whose GPUs (``gpus`` of 4) a job holds for ``running_s``."""
    c = cluster()
    config = Configuration.of({"n0": gpus})
    run = JobState(spec=spec("r", (gpus,), 100.0 * gpus * running_s), phase="running",
                   current=config, throughput=100.0 * gpus)
    jobs = (run, *waiting)
    estimates = {j.id: flat(j.id, 100.0) for j in jobs}
    snap = Snapshot(now=NOW, cluster=c, jobs=jobs, estimates=estimates)
    reasons = PlanReasons(policy="test", priorities=priorities)
    return snap, Plan(assignments=(Assignment(JobId("r"), config),), reasons=reasons)


def test_positions_follow_the_policys_order_overall_and_within_the_tenant() -> None:
    waiting = [JobState(spec=spec(j, (4,), 1e5, tenant=t, submit=s))
               for j, t, s in (("x", "blue", 1.0), ("y", "red", 2.0), ("z", "blue", 3.0),
                               ("u", "red", 0.5))]
    # z ranks first, then y; x and u are unranked: after them, by submission.
    snap, plan = full_cluster(waiting, {JobId("z"): 2.0, JobId("y"): 1.0})
    out = {f.job_id: f for f in forecast(snap, plan, round_s=ROUND_S).jobs}
    assert out[JobId("r")].position == 0
    assert [(out[JobId(j)].position, out[JobId(j)].tenant_position)
            for j in ("z", "y", "u", "x")] == [(1, 1), (2, 1), (3, 2), (4, 2)]
    assert out[JobId("z")].start <= out[JobId("y")].start <= out[JobId("x")].start


def test_a_smaller_set_is_offered_only_when_it_starts_a_round_earlier() -> None:
    # Two GPUs are free; the job needs four. The running job holds two for
    # an hour: half its requirement starts at the next plan instead.
    waiting = [JobState(spec=spec("w", (4,), 1e5))]
    snap, plan = full_cluster(waiting, {}, running_s=3600.0, gpus=2)
    (f,) = [f for f in forecast(snap, plan, round_s=ROUND_S).jobs if f.job_id == "w"]
    (alt,) = f.whatif
    assert alt.kind == "smaller" and alt.max_gpus == 2
    assert alt.start <= f.start - ROUND_S
    # Held for a minute only, the job itself starts as soon: no what-if.
    snap, plan = full_cluster(waiting, {}, running_s=60.0, gpus=2)
    (f,) = [f for f in forecast(snap, plan, round_s=ROUND_S).jobs if f.job_id == "w"]
    assert f.whatif == ()


def test_an_opportunistic_run_is_offered_where_tenant_cells_restrict_the_job() -> None:
    c = cluster(servers=2)
    config = Configuration.of({"n0": 4})
    run = JobState(spec=spec("r", (4,), 100.0 * 4 * 7200), phase="running",
                   current=config, throughput=400.0)
    w = JobState(spec=spec("w", (4,), 1e5, tenant="blue"))
    snap = Snapshot(now=NOW, cluster=c, jobs=(run, w),
                    estimates={JobId("r"): flat("r", 100.0), JobId("w"): flat("w", 100.0)})
    plan = Plan(assignments=(Assignment(JobId("r"), config),))
    cells = {TenantId("blue"): frozenset({ServerId("n0")})}
    (f,) = [f for f in forecast(snap, plan, round_s=ROUND_S, tenant_cells=cells).jobs
            if f.job_id == "w"]
    kinds = {a.kind: a for a in f.whatif}
    assert "opportunistic" in kinds and kinds["opportunistic"].start == NOW + ROUND_S
    assert f.start >= NOW + 7200


def test_calibration_widens_an_interval_that_was_too_narrow() -> None:
    cal = Calibration()
    narrow = Interval(NOW + 250.0, NOW + 300.0, NOW + 350.0, position=1)
    # Every start came two rounds after the point: far outside the interval.
    for _ in range(40):
        cal = observe(cal, "start", NOW, narrow, NOW + 900.0, ROUND_S)
    fixed = apply(cal, "start", NOW, narrow, ROUND_S)
    assert fixed.lo <= NOW + 900.0 <= fixed.hi
    assert fixed.point == pytest.approx(NOW + 900.0)
    assert fixed.hi > narrow.hi
    # Too few residuals: left as the draws made it.
    few = observe(Calibration(), "start", NOW, narrow, NOW + 900.0, ROUND_S)
    assert apply(few, "start", NOW, narrow, ROUND_S) == narrow
    assert msgspec.json.decode(msgspec.json.encode(cal), type=Calibration) == cal


def test_a_job_still_waiting_past_its_high_end_widens_the_band_before_it_starts() -> None:
    narrow = Interval(NOW + 250.0, NOW + 300.0, NOW + 350.0, position=1)
    cal = Calibration()
    # Earlier forecasts of this band resolved inside their interval.
    for _ in range(40):
        cal = observe(cal, "start", NOW, narrow, NOW + 300.0, ROUND_S)
    later = NOW + 4 * ROUND_S
    moved = Interval(later + 250.0, later + 300.0, later + 350.0, position=1)
    before = apply(cal, "start", later, moved, ROUND_S)
    assert before.hi <= moved.hi
    # Forty more of the band are still open, their jobs not started four
    # rounds on, past their high end: known misses, counted now.
    pending = [(NOW, narrow)] * 40
    known = with_known_misses(cal, "start", pending, later, ROUND_S)
    widened = apply(known, "start", later, moved, ROUND_S)
    assert widened.hi > before.hi + ROUND_S
    assert widened.point > before.point
    # The state kept is untouched (the real residuals replace these when
    # the jobs start), and open forecasts not yet past their high end add
    # nothing.
    assert len(cal.start) == 40
    assert with_known_misses(cal, "start", pending, NOW + 349.0, ROUND_S) is cal


def test_shown_intervals_that_keep_missing_high_widen_the_high_side() -> None:
    narrow = Interval(NOW + 250.0, NOW + 300.0, NOW + 350.0, position=1)
    cal = Calibration()
    # Starts spread from the point to five rounds later.
    for k in range(50):
        cal = observe(cal, "start", NOW, narrow, NOW + 300.0 + 30.0 * k, ROUND_S)
    shown = apply(cal, "start", NOW, narrow, ROUND_S)
    # Yet the shown intervals keep missing on the high side (the past
    # residuals lag behind a drift): its miss level falls, the side widens.
    missed = cal
    for _ in range(10):
        missed = track(missed, "start", shown, shown.hi + ROUND_S)
    assert missed.start_miss[1] < cal.start_miss[1] and missed.start_miss[0] > 0.1
    assert apply(missed, "start", NOW, narrow, ROUND_S).hi > shown.hi
    # Hits move the level back up, towards 10% a side.
    hit = track(missed, "start", shown, shown.point)
    assert hit.start_miss[1] > missed.start_miss[1]
    assert missed.finish_miss == cal.finish_miss


def sim_jobs() -> tuple[Cluster, list[SimJob], GroundTruth]:
    c = cluster()
    truth = GroundTruth(c, builtin_catalog())
    rate = truth.throughput(MODEL, Configuration.of({"n0": 4}))
    jobs = [SimJob(spec=spec("a", (4,), rate * 1800), model=MODEL),
            SimJob(spec=spec("b", (4,), rate * 1800, submit=10.0), model=MODEL)]
    return c, jobs, truth


def test_the_simulator_records_forecasts_only_when_asked() -> None:
    c, jobs, truth = sim_jobs()
    off = Simulation(c, jobs, make_policy(resolve("hops")), truth, SimSettings()).run()
    assert off.forecasts == ()
    on = Simulation(c, jobs, make_policy(resolve("hops")), truth,
                    SimSettings(forecast=True)).run()
    assert [j.finish for j in on.jobs] == [j.finish for j in off.jobs]  # plans unchanged
    # The two jobs take turns on the server: whichever waits is recorded.
    waited = list(on.forecasts)
    assert waited and all(r.actual_start is not None and r.actual_finish is not None
                          for r in waited)
    first = waited[0]
    f = first.forecast
    assert (first.at, f.position, first.gpus) == (ROUND_S, 1, 4)
    assert f.start_lo <= f.start <= f.start_hi
    assert first.actual_start is not None and first.actual_start > first.at


def test_running_jobs_measuring_twice_the_estimate_halve_a_waiting_jobs_run() -> None:
    # Four 1-GPU jobs hold the server's four GPUs; a fifth waits behind
    # them. Their heartbeats measure twice the estimate: the estimator is
    # biased by 2 (an emulated cluster's time scale, say), so the waiting
    # job's run, on the same estimates, is forecast at half the estimate's.
    per_gpu, samples = 100.0, 100_000.0
    running = [JobState(spec=spec(f"r{i}", (1,), 1e9), phase="running",
                        current=Configuration.of({"n0": 1}), throughput=measured,
                        throughput_since=0.0)
               for i, measured in enumerate((2 * per_gpu,) * 4)]
    waiting = JobState(spec=spec("w", (1,), samples), phase="queued")
    jobs = (*running, waiting)
    ests = {j.id: flat(j.id, per_gpu) for j in jobs}
    snap = Snapshot(now=NOW, cluster=cluster(1, 4), jobs=jobs, estimates=ests,
                    held={ServerId("n0"): 4}, first_plan=False)
    plan = Plan(reasons=PlanReasons(policy="hops", priorities={JobId("w"): 1.0}))
    biased = {f.job_id: f for f in forecast(snap, plan, round_s=ROUND_S, draws=2,
                                            arrivals=False).jobs}
    unbiased_jobs = tuple(msgspec.structs.replace(j, throughput=per_gpu) if j.phase == "running"
                          else j for j in jobs)
    fair = {f.job_id: f for f in forecast(msgspec.structs.replace(snap, jobs=unbiased_jobs),
                                          plan, round_s=ROUND_S, draws=2, arrivals=False).jobs}
    w, w0 = biased[JobId("w")], fair[JobId("w")]
    # the run itself (finish - start) is the estimate's halved
    assert w0.finish - w0.start == pytest.approx(samples / per_gpu + RESTART_S, rel=0.05)
    assert w.finish - w.start == pytest.approx(samples / (2 * per_gpu) + RESTART_S, rel=0.05)
