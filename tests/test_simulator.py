"""The discrete-event simulator: hand-checked timelines, fairness scenarios,
determinism and conservation, with the real core (planner, estimator, HiGHS)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.policies import make_policy
from experiments.common.simrun import RunSpec
from scheduling.rounds import RESTART_S, ROUND_S
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from simulator.engine import Simulation
from simulator.metrics import SimResult, ftf_rhos, summarize
from simulator.settings import SimSettings
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.truth import GroundTruth

MODEL = "resnet18-cifar10"
RTX = GpuType("RTX3090")


def small_cluster(servers: int = 1, gpus: int = 4) -> Cluster:
    return Cluster(
        gpu_types=(GpuTypeSpec(RTX, link_bandwidth=2.5e9, net_bandwidth=1e9),),
        servers=tuple(
            Server(ServerId(f"n{i}"), RTX, gpus, model="TIGERWAY YK8100-8G")
            for i in range(servers)
        ),
    )


def job(jid: str, reqs: tuple[int, ...], samples: float, submit: float = 0.0) -> SimJob:
    spec = JobSpec(
        id=JobId(jid), model=MODEL, batch_size=256, params=11_181_642,
        total_samples=int(samples), requirements=reqs, submit_time=submit,
    )
    return SimJob(spec=spec, model=MODEL)


def run(cluster: Cluster, jobs: list[SimJob], policy: str = "hops", priority: str = "lr",
        seed: int = 0) -> tuple[SimResult, GroundTruth]:
    truth = GroundTruth(cluster, builtin_catalog())
    sim = Simulation(cluster, jobs, make_policy(policy, priority), truth, SimSettings(seed=seed))
    return sim.run(), truth


def test_single_job_timeline_is_exact() -> None:
    # Profiling ends, the fill plan starts the job at once on all 4 GPUs, and
    # it runs undisturbed: finish = start + restart cost + samples / rate.
    cluster = small_cluster()
    truth = GroundTruth(cluster, builtin_catalog())
    rate = truth.throughput(MODEL, Configuration.of({"n0": 4}))
    samples = rate * 3600  # one hour of work
    result, _ = run(cluster, [job("a", (1, 2, 4), samples)])
    (a,) = result.jobs
    assert a.first_start is not None and a.finish is not None
    assert a.finish == pytest.approx(a.first_start + 30.0 + int(samples) / rate, rel=1e-9)
    # It waited at most the 30 s a later-in-round plan may be deferred.
    assert a.wait_s <= 30.0 + 1e-6 and a.restarts == 1


def test_two_jobs_on_one_server_share_it_in_turn() -> None:
    # Both need the whole server; work is conserved, so the last one finishes
    # no earlier than both runs back to back, and someone waited.
    cluster = small_cluster()
    truth = GroundTruth(cluster, builtin_catalog())
    rate = truth.throughput(MODEL, Configuration.of({"n0": 4}))
    jobs = [job("a", (4,), rate * 1800), job("b", (4,), rate * 1800, submit=10.0)]
    result, _ = run(cluster, jobs)
    finishes = sorted(j.finish for j in result.jobs if j.finish is not None)
    assert len(finishes) == 2
    first_start = min(j.first_start for j in result.jobs if j.first_start is not None)
    assert finishes[1] >= first_start + 2 * 1800 + 2 * 30.0 - 1e-6
    assert max(j.wait_s for j in result.jobs) >= 1800 - 1e-6


def starving_workload() -> list[SimJob]:
    # A long job arrives with a steady stream of short ones, each needing the
    # whole server for about 10 minutes.
    cluster = small_cluster()
    truth = GroundTruth(cluster, builtin_catalog())
    rate = truth.throughput(MODEL, Configuration.of({"n0": 4}))
    jobs = [job("long", (4,), rate * 3600)]
    jobs += [job(f"s{i:02d}", (4,), rate * 600, submit=60.0 + 600.0 * i) for i in range(24)]
    return jobs


def test_latency_ratio_bounds_the_starvation_that_srtf_allows() -> None:
    # The stream keeps the server saturated, so someone must wait. SRTF lets
    # whoever loses the remaining-time race starve; LR priority spreads the
    # waiting in proportion to each job's age (Figure 13 of the paper), so the
    # worst latency ratio is far lower and the long job is no outlier.
    # Every job needs the whole server, so a newcomer is profiled only if
    # profiling may take the running job's GPUs at a round boundary: the
    # paper's profiling-first (by default profiling waits for an idle GPU).
    # The priority alone is compared: no preemption exemption (which holds a
    # job that just started for 10 restarts' time, whatever its priority).
    cluster = small_cluster()
    max_lr, long_lr = {}, {}
    for priority in ("lr", "srtf"):
        result, _ = run(cluster, starving_workload(), "hops-profile-preempt:preempt_exempt=0",
                        priority)
        max_lr[priority] = max(j.lr for j in result.jobs)
        long_lr[priority] = next(j.lr for j in result.jobs if j.id == "long")
    assert max_lr["lr"] < max_lr["srtf"] / 2
    assert long_lr["lr"] >= 0.8 * max_lr["lr"]


def test_by_default_profiling_waits_for_the_running_job() -> None:
    # The same stream with profiling on idle GPUs only: the long job is
    # never stopped for a newcomer's profiling run, so it runs in one go.
    result, _ = run(small_cluster(), starving_workload())
    long = next(j for j in result.jobs if j.id == "long")
    assert long.restarts == 1  # its first start, which costs a restart too


def test_same_seed_same_run_and_seeds_matter() -> None:
    cluster = small_cluster(servers=2)
    jobs = [job(f"j{i}", (1, 2, 4), 2e6 * (i + 1), submit=100.0 * i) for i in range(6)]

    def untimed(result: SimResult) -> SimResult:
        rounds = tuple(msgspec.structs.replace(r, planner_s=0.0) for r in result.rounds)
        return msgspec.structs.replace(result, rounds=rounds, plan_seconds=())

    a, _ = run(cluster, jobs, seed=3)
    b, _ = run(cluster, jobs, seed=3)
    c, _ = run(cluster, jobs, seed=4)
    assert untimed(a) == untimed(b)
    assert untimed(a) != untimed(c)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([(1,), (2,), (1, 2), (2, 4), (4,), (1, 2, 4, 8), (8,)]),
            st.floats(2e5, 3e7),
            st.floats(0, 7200),
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["hops", "sia", "sia-lp-start", "gavel"]),
)
def test_conservation(specs: list[tuple[tuple[int, ...], float, float]], policy: str) -> None:
    cluster = small_cluster(servers=2)
    jobs = [job(f"j{i}", reqs, samples, submit) for i, (reqs, samples, submit) in enumerate(specs)]
    result, _ = run(cluster, jobs, policy=policy)
    summary = summarize(result, cluster)
    assert summary["jobs_finished"] == len(jobs)
    # Every round's allocation fits the cluster (the engine also refuses any
    # over-allocation outright), and no job waited longer than it existed.
    for r in result.rounds:
        assert 0 <= r.idle <= cluster.total_gpus
    for j in result.jobs:
        assert j.finish is not None and j.first_start is not None
        assert j.wait_s <= j.finish - j.submit + 1e-6
        assert j.first_start >= j.submit


def test_round_metrics_match_their_definitions() -> None:
    # RAQLR (Eq. 7) per round and FTF's contention per job are read from the
    # tail of the finished list and from prefix sums; both must equal the
    # definitions evaluated over everything.
    cluster = small_cluster(servers=1)
    jobs = [job(f"j{i}", (1, 2), 1.5e6 * (1 + i % 3), submit=900.0 * i) for i in range(8)]
    result, _ = run(cluster, jobs)
    ended = [(j.finish, j.lr) for j in result.jobs if j.finish is not None]
    assert len(ended) == len(jobs)
    for r in result.rounds:
        recent = [lr for t, lr in ended if r.t - 3600.0 <= t <= r.t]
        assert r.raqlr == pytest.approx(sum(recent) / len(recent) if recent else 0.0)
    assert any(r.raqlr > 0 for r in result.rounds)
    rhos = ftf_rhos(result, cluster)
    for j in result.jobs:
        assert j.finish is not None and j.jct_s is not None
        inside = [r.waiting + r.running for r in result.rounds if j.submit <= r.t <= j.finish]
        n = max(1.0, sum(inside) / len(inside) if inside else 1.0)
        share = min(float(j.max_gpus), max(1.0, cluster.total_gpus / n))
        assert rhos[j.id] == pytest.approx(j.jct_s / (j.age_s * j.r_avg / share))


def test_a_job_is_not_held_in_profiling_for_a_type_that_running_jobs_fill() -> None:
    # Type A is filled by a long job for an hour; a newcomer profiled on B
    # runs there at once instead of waiting for A, and is profiled on A
    # once A is free again.
    a, b = GpuType("RTX3090"), GpuType("TitanXP")
    cluster = Cluster(
        gpu_types=(GpuTypeSpec(a, 2.5e9, 1e9), GpuTypeSpec(b, 1.25e9, 1e9)),
        servers=(Server(ServerId("a0"), a, 4), Server(ServerId("b0"), b, 4)),
    )
    truth = GroundTruth(cluster, builtin_catalog())
    rate = truth.throughput(MODEL, Configuration.of({"a0": 4}))
    jobs = [job("long", (4,), rate * 3600), job("late", (1,), rate * 60, submit=600.0)]
    sim = Simulation(cluster, jobs, make_policy("hops"), truth, SimSettings())
    result = sim.run()
    long, late = (next(j for j in result.jobs if j.id == i) for i in ("long", "late"))
    assert late.first_start is not None and long.finish is not None
    assert late.first_start < long.finish
    assert long.restarts == 1  # never stopped for the newcomer's profiling


def test_plans_are_checked_against_the_policys_own_r_num() -> None:
    # Bounds 1..15 become {1, 8, 15} under R_num = 3 but {1, 3, ..., 15}
    # under the default 8: the simulator must take the policy's 8 GPUs, and
    # report the requirement set that the policy planned with.
    cluster = small_cluster(gpus=8)
    truth = GroundTruth(cluster, builtin_catalog())
    rate = truth.throughput(MODEL, Configuration.of({"n0": 8}))
    spec = JobSpec(id=JobId("a"), model=MODEL, batch_size=256, params=11_181_642,
                   total_samples=int(rate * 600), min_gpus=1, max_gpus=15)
    jobs = [SimJob(spec=spec, model=MODEL)]
    policy = make_policy("hops:r_num=3")
    (a,) = Simulation(cluster, jobs, policy, truth, SimSettings(r_num=3)).run().jobs
    assert a.finish is not None
    assert (a.min_gpus, a.max_gpus, a.r_avg) == (1, 15, 8.0)
    with pytest.raises(RuntimeError, match="not a requirement"):
        Simulation(cluster, jobs, make_policy("hops:r_num=3"), truth, SimSettings()).run()


def test_the_round_and_the_restart_have_one_definition() -> None:
    # The restart: each model's own cost (world.restarts) unless a run sets
    # one for all; RESTART_S for a job whose cost is not known.
    assert (SimSettings().round_s, SimSettings().restart_s) == (ROUND_S, None)
    assert RunSpec("c", "w").round_s == ROUND_S
    assert RESTART_S == 30.0
