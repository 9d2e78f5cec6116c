"""CPU cores in the simulator: a layer written here attaches cores to every
configuration its policy chooses; the simulator books them on its Ledger,
records them, and stops a plan that over-allocates cores, naming them."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.layers.base import stack, without_extras
from scheduling.policy import Policy
from scheduling.registry import make_policy
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.resources import NOTHING, OverAllocation, Resources
from shared.snapshot import Assignment, Plan, Snapshot
from simulator.engine import Simulation
from simulator.metrics import SimResult
from simulator.workloads import SimJob
from tests.cores_layer import CoresPerGpu
from world.catalog import builtin_catalog
from world.truth import GroundTruth

CORES = 8  # per server of 4 GPUs


def cores_cluster() -> Cluster:
    rtx = GpuType("RTX3090")
    spec = GpuTypeSpec(rtx, link_bandwidth=2.5e9, net_bandwidth=1e9)
    return Cluster(
        gpu_types=(spec,),
        servers=tuple(
            Server(ServerId(f"n{i}"), rtx, 4, model="TIGERWAY YK8100-8G", cores=CORES)
            for i in range(3)
        ),
    )


def workload(count: int = 6, requirements: tuple[int, ...] = (1, 2, 4),
             model: str = "resnet18-cifar10", samples: int = 200_000) -> list[SimJob]:
    m = builtin_catalog()[model]
    return [
        SimJob(
            spec=JobSpec(
                JobId(f"j{i}"), model, m.batch_size, m.params, samples,
                requirements=requirements, submit_time=60.0 * i,
            ),
            model=model,
        )
        for i in range(count)
    ]


def simulation(policy: Policy, jobs: list[SimJob]) -> Simulation:
    c = cores_cluster()
    return Simulation(c, jobs, policy, GroundTruth(c, builtin_catalog()))


def started(sim: Simulation) -> set[Configuration]:
    """Every configuration the simulator started a job on."""
    return {config for _, config in sim.speeds.cache}


def outcomes(result: SimResult) -> list[tuple[object, ...]]:
    return [(j.id, j.first_start, j.finish, j.restarts) for j in result.jobs]


@pytest.mark.parametrize("name", ["hops", "sia", "gavel"])
def test_cores_that_fit_are_booked_recorded_and_change_nothing_else(name: str) -> None:
    # DistilBERT trains at full speed from one core per GPU (Synergy's BERT
    # curve, world.cpu_scaling): cores that fit cost it nothing.
    layer = CoresPerGpu(2)
    sim = simulation(stack(make_policy(name), layer), workload(model="distilbert-imdb"))
    result = sim.run()
    assert all(j.finish is not None for j in result.jobs)
    configs = started(sim)
    assert configs and all(
        c.extras and all(c.demand_on(s).cores == 2 * g for s, g in c.parts) for c in configs
    )
    assert not sim.occ.ledger.holders() and not sim.occ.extras  # all released at the end
    # Cores never short: the GPU-only policy decides exactly as without them.
    bare = simulation(make_policy(name), workload(model="distilbert-imdb"))
    assert outcomes(bare.run()) == outcomes(result)
    assert {c.gpus_only for c in configs} == started(bare)


def test_too_many_cores_per_gpu_stop_the_simulator_naming_cores() -> None:
    # Every job takes a whole server: 4 GPUs with 3 cores each, of 8.
    sim = simulation(stack(make_policy("hops"), CoresPerGpu(3)), workload(2, (4,)))
    with pytest.raises(OverAllocation, match=r"over-allocates: job j0: n\d has 8 CPU cores "
                                             r"free of 8, 12 needed"):
        sim.run()


def test_a_layer_can_refuse_its_own_plan_with_the_check() -> None:
    sim = simulation(stack(make_policy("sia"), CoresPerGpu(3, verify=True)), workload(2, (4,)))
    with pytest.raises(ValueError, match=r"cores-per-gpu: job j0: .* CPU cores"):
        sim.run()


class Squeeze:
    """Puts every job's assignment on server n0 with 4 cores: two of them
    over-allocate n0's cores while each alone fits."""

    name = "squeeze"

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan = inner.plan(without_extras(snapshot))
        config = Configuration.of({"n0": 1}).with_extras({ServerId("n0"): Resources(cores=5)})
        return msgspec.structs.replace(
            plan, assignments=tuple(Assignment(a.job_id, config) for a in plan.assignments)
        )


def test_the_ledger_catches_cores_over_allocated_across_jobs() -> None:
    sim = simulation(stack(make_policy("gavel"), Squeeze()), workload(3, (1,)))
    with pytest.raises(OverAllocation, match="n0 has 3 CPU cores free of 8, 5 needed"):
        sim.run()


def assert_booked_within_capacity(sim: Simulation) -> None:
    """The simulator's Ledger against its capacities and against the jobs
    that run: every resource of every server within capacity, and each
    running job holding exactly its configuration's demands."""
    ledger, occ = sim.occ.ledger, sim.occ
    for s in sim.cluster.servers:
        used = ledger.used(s.id)
        assert used.fits_in(s.capacity), (s.id, used)
        assert used.gpus == occ.used(s.id)
        assert Resources(0, used.cores, used.memory_mb) == occ.extras.get(s.id, NOTHING)
    for rec in sim.live.values():
        if rec.phase == "running":
            assert rec.current is not None
            assert ledger.held_by(f"job {rec.id}") == rec.current.demands()


@settings(max_examples=8, deadline=None)
@given(
    st.sampled_from(["hops", "sia", "gavel"]),
    st.integers(0, CORES // 4),
    st.integers(2, 6),
    st.sampled_from([(1, 2, 4), (1, 2), (2, 4), (1,)]),
)
def test_no_server_is_ever_over_allocated_with_cores(
    name: str, per_gpu: int, count: int, requirements: tuple[int, ...]
) -> None:
    sim = simulation(stack(make_policy(name), CoresPerGpu(per_gpu)), workload(count, requirements))
    result = sim.run(progress=lambda *_: assert_booked_within_capacity(sim))
    assert all(j.finish is not None for j in result.jobs)
    if per_gpu:
        assert all(c.demand_on(c.servers[0]).cores for c in started(sim))


def test_too_few_cores_slow_a_cpu_hungry_job_as_synergy_measured() -> None:
    # ResNet-18 needs 9 cores per GPU for its peak (Synergy's res18): with
    # one it runs at 0.37 / 2.4 of its GPU-only speed.
    long = workload(1, (1,), samples=20_000_000)
    few = simulation(stack(make_policy("hops"), CoresPerGpu(1)), long).run()
    many = simulation(stack(make_policy("hops"), CoresPerGpu(8)), long)
    rich = simulation(make_policy("hops"), long).run()
    assert not many.cluster.servers[0].cores >= 9  # 8 of the 9 it wants: nearly full speed
    slow, fast, bare = (r.jobs[0] for r in (few, many.run(), rich))
    assert slow.jct_s is not None and fast.jct_s is not None and bare.jct_s is not None
    assert slow.busy_gpu_s / slow.held_gpu_s < 0.2 < 0.85 < fast.busy_gpu_s / fast.held_gpu_s
    assert slow.jct_s > 4 * bare.jct_s and fast.jct_s < 1.2 * bare.jct_s
