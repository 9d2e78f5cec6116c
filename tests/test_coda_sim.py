"""The core policies in the simulator: every plan of every policy fits every
server in every resource (the engine's Ledger raises otherwise), CPU jobs
run beside GPU jobs, and CODA's climb changes cores in place."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.coda.workload import HEAVY_MODEL
from scheduling.layers.base import stack, without_extras
from scheduling.policy import Policy
from scheduling.registry import make_policy
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.resources import Resources
from shared.snapshot import Plan, Snapshot
from simulator.engine import Simulation
from simulator.metrics import SimResult
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.truth import GroundTruth

RTX = GpuType("RTX3090")
MODELS = ("resnet18-cifar10", "distilbert-imdb")


def cluster(servers: int, cores: int, bandwidth: float, mba: bool = False) -> Cluster:
    return Cluster(gpu_types=(GpuTypeSpec(RTX, 2.5e9, 1e9),), servers=tuple(
        Server(ServerId(f"n{i}"), RTX, 4, cores=cores, memory_bandwidth_gbps=bandwidth,
               mba=mba)
        for i in range(servers)))


def gpu(i: int, model: str, gpus: int, cores: int, at: float,
        samples: int = 400_000) -> SimJob:
    m = builtin_catalog()[model]
    spec = JobSpec(JobId(f"g{i}"), model, m.batch_size, m.params, samples,
                   requirements=(gpus,), submit_time=at, cores=cores,
                   category="cv" if model.startswith("resnet") else "nlp",
                   tenant=TenantId(f"t{i % 2}"))
    return SimJob(spec, model)


def cpu(i: int, cores: int, at: float, heavy: bool) -> SimJob:
    model = HEAVY_MODEL if heavy else "cpu"
    spec = JobSpec(JobId(f"c{i}"), model, 1, 1, 600 * cores, kind="cpu", cores=cores,
                   submit_time=at, tenant=TenantId(f"t{i % 3}"))
    return SimJob(spec, model)


def run(policy: str, c: Cluster, jobs: list[SimJob]) -> tuple[Simulation, SimResult]:
    sim = Simulation(c, jobs, make_policy(policy), GroundTruth(c, builtin_catalog()))
    return sim, sim.run()


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Cluster, list[SimJob]]:
    cores = draw(st.integers(6, 24))
    c = cluster(draw(st.integers(1, 3)), cores, draw(st.sampled_from([0.0, 20.0, 60.0])),
                draw(st.booleans()))
    # Requests a server can hold (a larger one never runs under a baseline,
    # and live admission refuses it).
    jobs = [gpu(i, draw(st.sampled_from(MODELS)), gpus,
                draw(st.integers(0, cores // 4 * gpus)), 60.0 * draw(st.integers(0, 20)))
            for i in range(draw(st.integers(1, 5)))
            for gpus in [draw(st.sampled_from([1, 2, 4]))]]
    jobs += [cpu(i, draw(st.integers(1, 6)), 60.0 * draw(st.integers(0, 20)),
                 draw(st.booleans())) for i in range(draw(st.integers(0, 8)))]
    return c, jobs


@settings(max_examples=15, deadline=None)
@given(workloads(), st.sampled_from(["coda", "fifo", "drf", "fixed-cores"]))
def test_every_job_finishes_and_no_plan_overallocates(
        w: tuple[Cluster, list[SimJob]], policy: str) -> None:
    c, jobs = w
    sim, result = run(policy, c, jobs)  # an over-allocating plan raises
    assert all(j.finish is not None for j in result.jobs)
    assert not sim.occ.ledger.holders()
    again = run(policy, c, jobs)[1]
    assert [(j.id, j.finish) for j in again.jobs] == [(j.id, j.finish) for j in result.jobs]


def test_coda_climbs_in_place_and_runs_cpu_jobs_beside() -> None:
    c = cluster(1, 28, 0.0)
    jobs = [gpu(0, "resnet18-cifar10", 1, 2, 0.0, samples=40_000_000), cpu(0, 4, 0.0, False)]
    sim, result = run("coda", c, jobs)
    g = next(j for j in result.jobs if j.id == "g0")
    assert g.retunes >= 3 and g.restarts == 1  # the climb never restarted it
    climb = sim.jobs[JobId("g0")]
    assert climb.current is None and climb.factor > 0.9  # ResNet-18 climbed near its peak
    cj = next(j for j in result.jobs if j.id == "c0")
    assert cj.first_start == 0.0 or (cj.first_start is not None and cj.first_start < 60.0)


class Swap:
    """Gives two jobs on one server 3 and 1 cores, the other way round at
    every first plan: each plan fits, yet one job grows in place where the
    other shrinks."""

    name = "swap"

    def __init__(self) -> None:
        self.flip = False

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan = inner.plan(without_extras(snapshot))
        if snapshot.first_plan:
            self.flip = not self.flip
        cores = {"g0": 3, "g1": 1} if self.flip else {"g0": 1, "g1": 3}
        out = tuple(msgspec.structs.replace(a, config=a.config.with_extras(
            {s: Resources(cores=cores[a.job_id]) for s in a.config.servers}))
            for a in sorted(plan.assignments, key=lambda a: a.job_id))
        return msgspec.structs.replace(plan, assignments=out)


def test_cores_given_back_in_place_are_free_for_a_job_growing_in_the_same_plan() -> None:
    # Regression: the engine applied the growth first and its Ledger refused
    # a plan that fits.
    c = cluster(1, 4, 0.0)
    jobs = [gpu(i, "distilbert-imdb", 1, 0, 0.0, samples=4_000_000) for i in range(2)]
    sim = Simulation(c, jobs, stack(make_policy("hops"), Swap()),
                     GroundTruth(c, builtin_catalog()))
    result = sim.run()
    assert all(j.finish is not None for j in result.jobs)
    assert sum(j.retunes for j in result.jobs) >= 2


def test_mba_caps_the_heavy_cpu_jobs_and_spares_the_gpu_job_and_the_light_ones() -> None:
    """Two bandwidth-heavy and three light CPU jobs come beside a running
    NLP job (the most contention-sensitive category) on a server whose
    bandwidth they overrun. Halving cores (no MBA) slows every CPU job
    alike; MBA caps (simulator.contention) slow what draws beyond the cap,
    the heavy jobs, so the GPU job and the light jobs finish sooner."""

    def finish(mba: bool) -> dict[str, float]:
        c = Cluster(gpu_types=(GpuTypeSpec(RTX, 2.5e9, 1e9),), servers=(
            Server(ServerId("n0"), RTX, 4, cores=28, memory_bandwidth_gbps=40.0, mba=mba),))
        jobs = [gpu(0, "distilbert-imdb", 2, 4, 0.0, samples=4_000_000)]
        for i in range(5):
            model = HEAVY_MODEL if i < 2 else "cpu"
            jobs.append(SimJob(JobSpec(JobId(f"c{i}"), model, 1, 1, 24_000, kind="cpu",
                                       cores=4, submit_time=1200.0,
                                       tenant=TenantId(f"t{i}")), model))
        result = run("coda:subarrays=false", c, jobs)[1]
        assert all(j.restarts == 1 for j in result.jobs)  # throttles are in place
        return {j.id: j.finish or 0.0 for j in result.jobs}

    halved, capped = finish(False), finish(True)
    assert capped["g0"] < 0.9 * halved["g0"]
    assert all(capped[f"c{i}"] < 0.8 * halved[f"c{i}"] for i in (2, 3, 4))
    assert max(capped["c2"], capped["c3"], capped["c4"]) < min(capped["c0"], capped["c1"])
