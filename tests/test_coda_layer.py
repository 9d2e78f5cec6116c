"""The core layer (scheduling/cores/layer.py): CODA's multi-array scheme and
its baselines around a real inner policy (Hops' ILP), plan by plan."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.check import plan_overallocation
from scheduling.cores.state import decode
from scheduling.registry import make_policy, schedules_cores
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.snapshot import JobState, Plan, Snapshot
from tests.helpers import flat_estimate, untimed

T = GpuType("A")


def cluster(servers: int = 1, gpus: int = 4, cores: int = 16) -> Cluster:
    return Cluster(gpu_types=(GpuTypeSpec(T, 2.5e9, 1e9),), servers=tuple(
        Server(ServerId(f"n{i}"), T, gpus, cores=cores) for i in range(servers)))


def gpu_job(job_id: str, reqs: tuple[int, ...], submit: float = 0.0, **kw: object) -> JobState:
    spec = JobSpec(JobId(job_id), "m", 32, 10_000_000, 10_000_000, requirements=reqs,
                   submit_time=submit, category="cv")
    return JobState(spec=spec, **kw)  # type: ignore[arg-type]


def cpu_job(job_id: str, cores: int, submit: float = 0.0, tenant: str = "t",
            **kw: object) -> JobState:
    spec = JobSpec(JobId(job_id), "cpu", 1, 1, 3600, kind="cpu", cores=cores,
                   submit_time=submit, tenant=TenantId(tenant))
    return JobState(spec=spec, **kw)  # type: ignore[arg-type]


def snap(c: Cluster, jobs: list[JobState], state: bytes = b"", now: float = 0.0,
         first: bool = True) -> Snapshot:
    ests = {j.id: flat_estimate(j.id, {"A": 100.0}) for j in jobs if j.spec.kind == "gpu"}
    return Snapshot(now=now, cluster=c, jobs=tuple(jobs), estimates=ests, first_plan=first,
                    layer_state={"coda": state} if state else {})


def state_of(plan: Plan, name: str = "coda") -> bytes:
    return next(r.state for r in plan.reasons.layers if r.name == name)


def test_core_policies_are_registered_and_take_cpu_jobs() -> None:
    from scheduling.registry import parse_policy

    for name in ("coda", "fifo", "drf", "fixed-cores"):
        assert schedules_cores(parse_policy(name))
    assert not schedules_cores(parse_policy("hops"))


def test_gpu_jobs_get_cores_beside_their_gpus_and_cpu_jobs_fill_the_array() -> None:
    c = cluster()
    policy = make_policy("coda:reserve_per_gpu=2")
    plan = policy.plan(snap(c, [gpu_job("g", (2,)), cpu_job("c", 6)]))
    assert plan_overallocation(snap(c, []), plan) is None
    g = plan.config_of(JobId("g"))
    assert g is not None and g.cores_on(ServerId("n0")) == 2 * 3  # the CV start, 3 per GPU
    assert plan.config_of(JobId("c")) == Configuration.cpu(ServerId("n0"), 6)
    assert plan.wake_after_s == 90.0  # the climb samples once a period


def test_a_borrower_is_stopped_and_requeued_at_the_head_when_a_gpu_job_needs_its_cores() -> None:
    c = cluster(cores=16)  # 4 GPUs: 8 cores reserved (2 per GPU), 8 in the CPU array
    policy = make_policy("coda:reserve_per_gpu=2,subarrays=false")
    first = policy.plan(snap(c, [cpu_job("big", 12), cpu_job("small", 8, submit=1.0)]))
    assert first.config_of(JobId("big")) is not None  # 8 of its 12 cores are borrowed
    assert JobId("big") in decode(state_of(first)).borrowers
    assert first.config_of(JobId("small")) is None  # nothing left
    running = [cpu_job("big", 12, phase="running", current=first.config_of(JobId("big"))),
               cpu_job("small", 8, submit=1.0, wait_s=600.0)]
    # A GPU job arrives that needs the reserved cores (4 GPUs x 2, settled on 2).
    job = gpu_job("g", (4,), submit=2.0)
    plan = make_policy("coda:reserve_per_gpu=2,subarrays=false,start_cv=2").plan(
        snap(c, [*running, job], state_of(first), now=700.0))
    assert plan.config_of(JobId("g")) is not None
    assert plan.config_of(JobId("big")) is None  # stopped: left out of the first plan
    record = next(r for r in plan.reasons.layers if r.name == "coda")
    assert record.removed == (JobId("big"),)
    after = decode(record.state)
    assert after.head == (JobId("big"),) and JobId("big") not in after.borrowers
    # Cores free up: the stopped borrower goes before the job that waited longer.
    gone = [cpu_job("big", 12, wait_s=10.0), cpu_job("small", 8, submit=1.0, wait_s=900.0)]
    c2 = cluster(cores=14)  # 8 reserved, 6 in the array: one of the two fits
    later = make_policy("coda:reserve_per_gpu=2,subarrays=false").plan(
        snap(c2, gone, record.state, now=800.0))
    assert later.config_of(JobId("big")) is not None
    assert later.config_of(JobId("small")) is None


def test_gpu_jobs_never_take_cpu_array_cores() -> None:
    c = cluster(cores=16)  # 2 reserved: a 4-GPU job needs at least 4 (one per GPU)
    plan = make_policy("coda:reserve_per_gpu=0.5,subarrays=false").plan(
        snap(c, [gpu_job("g", (4,))]))
    assert plan.config_of(JobId("g")) is None
    small = make_policy("coda:reserve_per_gpu=0.5,subarrays=false").plan(
        snap(c, [gpu_job("g", (2,))]))
    g = small.config_of(JobId("g"))
    assert g is not None and g.total_cores == 2  # the CV start squeezed to what is reserved
    fifo = make_policy("fifo").plan(snap(c, [gpu_job("g", (4,))]))
    assert fifo.config_of(JobId("g")) is not None  # one pool: requested (1 per GPU) fits


def test_fixed_cores_give_each_server_its_share_per_gpu() -> None:
    c = cluster(cores=28, gpus=5)
    plan = make_policy("fixed-cores").plan(snap(c, [gpu_job("g", (2,))]))
    g = plan.config_of(JobId("g"))
    assert g is not None and g.total_cores == 2 * 5


def test_the_climb_moves_a_running_job_in_place_in_a_later_plan() -> None:
    c = cluster(cores=16)
    policy = make_policy("coda:reserve_per_gpu=4,subarrays=false")
    first = policy.plan(snap(c, [gpu_job("g", (1,))]))
    config = first.config_of(JobId("g"))
    assert config is not None and config.total_cores == 3
    running = gpu_job("g", (1,), phase="running", current=config, throughput=100.0,
                      throughput_since=0.0)
    later = policy.plan(snap(c, [running], state_of(first), now=95.0, first=False))
    moved = later.config_of(JobId("g"))
    assert moved is not None and moved.parts == config.parts and moved.total_cores == 2
    assert plan_overallocation(
        msgspec.structs.replace(snap(c, [running], now=95.0, first=False),
                                held={ServerId("n0"): 1},
                                held_extras={ServerId("n0"): config.demand_on(ServerId("n0"))
                                             .minus(config.demand_on(ServerId("n0")))
                                             + config.extras[0]}),
        later) is None


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Cluster, list[JobState]]:
    c = cluster(servers=draw(st.integers(1, 3)), gpus=draw(st.sampled_from([2, 4, 5])),
                cores=draw(st.integers(4, 28)))
    jobs: list[JobState] = []
    for i in range(draw(st.integers(0, 6))):
        jobs.append(gpu_job(f"g{i}", (draw(st.sampled_from([1, 2, 4])),), submit=float(i)))
    for i in range(draw(st.integers(0, 8))):
        jobs.append(cpu_job(f"c{i}", draw(st.integers(1, 12)), submit=float(i),
                            tenant=draw(st.sampled_from(["a", "b"]))))
    return c, jobs


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sampled_from(["coda", "coda:reserve_per_gpu=2", "fifo", "drf",
                                     "fixed-cores"]))
def test_plans_never_overallocate_give_every_gpu_a_core_and_are_deterministic(
        w: tuple[Cluster, list[JobState]], name: str) -> None:
    c, jobs = w
    s = snap(c, jobs)
    plan = make_policy(name).plan(s)
    assert plan_overallocation(s, plan) is None
    ids = [a.job_id for a in plan.assignments]
    assert len(ids) == len(set(ids))  # a job holds at most one configuration
    kinds = {j.id: j.spec.kind for j in jobs}
    for a in plan.assignments:
        if kinds[a.job_id] == "gpu":
            assert all(a.config.cores_on(s_) >= g for s_, g in a.config.parts)
        else:
            assert a.config.total_gpus == 0
    if name.startswith("coda"):
        # The state names only jobs of this snapshot that were given GPUs.
        gpu_assigned = {a.job_id for a in plan.assignments if kinds[a.job_id] == "gpu"}
        assert set(decode(state_of(plan)).climbs) <= gpu_assigned
        per_gpu = 2 if "reserve" in name else 3
        for sid in (s_.id for s_ in c.servers):
            gpu_cores = sum(a.config.cores_on(sid) for a in plan.assignments
                            if kinds[a.job_id] == "gpu")
            assert gpu_cores <= min(c.servers[0].cores, per_gpu * c.servers[0].gpus)
    assert untimed(make_policy(name).plan(s)) == untimed(plan)


@pytest.mark.parametrize(("mba", "throttled_to"), [
    (False, Configuration.cpu(ServerId("n0"), 4)),  # the fallback: half the cores
    (True, Configuration.cpu(ServerId("n0"), 8, mba_percent=50)),  # MBA: the cores stay
])
def test_the_eliminator_throttles_cpu_jobs_when_bandwidth_is_high_and_a_gpu_job_drops(
        mba: bool, throttled_to: Configuration) -> None:
    c = Cluster(gpu_types=(GpuTypeSpec(T, 2.5e9, 1e9),), servers=(
        Server(ServerId("n0"), T, 4, cores=16, memory_bandwidth_gbps=100.0, mba=mba),))
    policy = make_policy("coda:reserve_per_gpu=2,subarrays=false")
    first = policy.plan(snap(c, [gpu_job("g", (1,)), cpu_job("c", 8)]))
    gpu_cfg, cpu_cfg = first.config_of(JobId("g")), first.config_of(JobId("c"))
    assert gpu_cfg is not None and cpu_cfg is not None
    state = state_of(first)
    g = gpu_job("g", (1,), phase="running", current=gpu_cfg, throughput=100.0)
    cj = cpu_job("c", 8, phase="running", current=cpu_cfg)
    sampled = policy.plan(snap(c, [g, cj], state, now=95.0, first=False))  # best: 100/s
    state = state_of(sampled)
    slower = msgspec.structs.replace(g, current=sampled.config_of(JobId("g")) or gpu_cfg,
                                     throughput=80.0, throughput_since=95.0)

    def at(bandwidth: float) -> Plan:
        s = msgspec.structs.replace(snap(c, [slower, cj], state, now=100.0, first=False),
                                    bandwidth_gbps={ServerId("n0"): bandwidth})
        return policy.plan(s)

    throttled = at(80.0)
    assert throttled.config_of(JobId("c")) == throttled_to
    assert all(a.job_id != "g" or a.config.parts == slower.current.parts  # type: ignore[union-attr]
               for a in throttled.assignments)  # never a GPU job
    assert at(70.0).config_of(JobId("c")) is None  # below the threshold: nothing
    steady = msgspec.structs.replace(slower, throughput=100.0)
    s = msgspec.structs.replace(snap(c, [steady, cj], state, now=100.0, first=False),
                                bandwidth_gbps={ServerId("n0"): 80.0})
    assert policy.plan(s).config_of(JobId("c")) is None  # no GPU job dropped: nothing


def test_cores_given_back_by_a_lift_are_not_given_to_a_waiting_job_too() -> None:
    # Regression: a lift booked the cores the job held before it, so the
    # cores it took back were placed a second time.
    c = Cluster(gpu_types=(GpuTypeSpec(T, 2.5e9, 1e9),), servers=(
        Server(ServerId("n0"), T, 4, cores=16, memory_bandwidth_gbps=100.0),))
    policy = make_policy("coda:reserve_per_gpu=1,subarrays=false")
    halved = cpu_job("c", 8, phase="running", current=Configuration.cpu(ServerId("n0"), 4))
    waiting = cpu_job("w", 12, submit=1.0, wait_s=60.0)  # fits only beside the halved job
    s = msgspec.structs.replace(snap(c, [halved, waiting], now=100.0, first=False),
                                held_extras={ServerId("n0"): halved.current.extras[0]},  # type: ignore[union-attr]
                                bandwidth_gbps={ServerId("n0"): 10.0})
    plan = policy.plan(s)
    assert plan.config_of(JobId("c")) == Configuration.cpu(ServerId("n0"), 8)  # lifted
    assert plan.config_of(JobId("w")) is None
    assert plan_overallocation(s, plan) is None


def test_an_mba_cap_stays_between_the_thresholds_and_is_lifted_below_them() -> None:
    c = Cluster(gpu_types=(GpuTypeSpec(T, 2.5e9, 1e9),), servers=(
        Server(ServerId("n0"), T, 4, cores=16, memory_bandwidth_gbps=100.0, mba=True),))
    policy = make_policy("coda:reserve_per_gpu=1,subarrays=false")
    capped = cpu_job("c", 8, phase="running",
                     current=Configuration.cpu(ServerId("n0"), 8, mba_percent=50))

    def at(bandwidth: float) -> Plan:
        s = msgspec.structs.replace(snap(c, [capped], now=100.0, first=False),
                                    held_extras={ServerId("n0"): capped.current.extras[0]},  # type: ignore[union-attr]
                                    bandwidth_gbps={ServerId("n0"): bandwidth})
        return policy.plan(s)

    assert at(10.0).config_of(JobId("c")) == Configuration.cpu(ServerId("n0"), 8)  # lifted
    assert at(70.0).config_of(JobId("c")) is None  # hysteresis: the cap stays


def test_a_cpu_job_past_the_wait_bound_goes_first_and_holds_the_array_until_it_fits() -> None:
    c = cluster(cores=16)  # 8 reserved (2 per GPU), 8 in the CPU array
    policy = make_policy("coda:reserve_per_gpu=2,subarrays=false,cpu_wait_bound_s=600")
    holder = cpu_job("holder", 4, phase="running", current=Configuration.cpu(ServerId("n0"), 4))
    gpu = gpu_job("g", (4,), phase="running")  # keeps the reserved cores busy
    big = cpu_job("big", 6, tenant="x", wait_s=700.0)  # past the bound: 4 free, 6 wanted
    small = cpu_job("small", 2, submit=5.0, tenant="y", wait_s=100.0)
    snapshot = snap(c, [holder, gpu, big, small])
    plan = policy.plan(snapshot)
    assert plan.config_of(JobId("big")) is None and plan.config_of(JobId("small")) is None
    note = next(r.note for r in plan.reasons.layers if r.name == "coda")
    assert "big past the wait bound blocks the array" in note and "longest 700 s" in note
    # Within the bound the small one is not held up.
    young = msgspec.structs.replace(big, wait_s=100.0)
    plan = policy.plan(snap(c, [holder, gpu, young, small]))
    assert plan.config_of(JobId("small")) is not None


def test_large_jobs_go_to_the_large_sub_array_and_small_ones_overflow() -> None:
    from scheduling.cores.state import CoreState, encode

    c = cluster(servers=2, gpus=4, cores=32)
    policy = make_policy("coda:reserve_per_gpu=4")
    # History: large jobs held 4 GPUs at once, so the first server is the
    # large sub-array, the second the small one.
    state = encode(CoreState(large_gpus=4))
    smalls = [gpu_job(f"s{i}", (1,), submit=float(i)) for i in range(5)]
    jobs = [*smalls[:2], gpu_job("L", (4,), submit=10.0)]
    plan = policy.plan(snap(c, jobs, state))
    where = {a.job_id: a.config.servers for a in plan.assignments}
    assert where == {"L": ("n0",), "s0": ("n1",), "s1": ("n1",)}
    # One array for all: the inner policy (the paper's latency-ratio queue)
    # packs the older small jobs first.
    mixed = make_policy("coda:reserve_per_gpu=4,subarrays=false,inner=hops:priority=lr").plan(
        snap(c, jobs, state))
    assert mixed.config_of(JobId("L")).servers == ("n1",)  # type: ignore[union-attr]
    # Without a large job waiting, a fifth small one overflows to the large
    # sub-array's idle GPUs.
    plan = policy.plan(snap(c, smalls, state))
    where = {a.job_id: a.config.servers for a in plan.assignments}
    assert sorted(where.values()) == [("n0",)] + [("n1",)] * 4


def test_a_core_policy_on_a_cluster_without_cores_says_so() -> None:
    import pytest

    bare = Cluster(gpu_types=(GpuTypeSpec(T, 2.5e9, 1e9),), servers=(Server(ServerId("n0"), T, 4),))
    with pytest.raises(ValueError, match="no server of cluster cluster declares any"):
        make_policy("fixed-cores").plan(snap(bare, [gpu_job("g", (1,))]))
