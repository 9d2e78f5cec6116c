"""Policy layers (scheduling/layers): a layer written in a test works
unchanged in the simulator; the profiling-first layer (Hops §3.2) over each
policy; the helpers a tenant layer (HiveD) is built from."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from scheduling.layers.base import (
    LayeredPolicy,
    annotate,
    drop,
    hold,
    hold_back,
    plan_groups,
    stack,
)
from scheduling.layers.profiling_first import ProfilingFirst, ProfilingSettings
from scheduling.policies.gavel.policy import GavelPolicy
from scheduling.policies.hops.policy import HopsPolicy
from scheduling.policies.sia.bootstrap import STATE as SIA_STATE
from scheduling.policies.sia.policy import SiaPolicy
from scheduling.policies.slurm.policy import SlurmPolicy
from scheduling.policies.themis.leases import STATE as THEMIS_STATE
from scheduling.policies.themis.policy import ThemisPolicy
from scheduling.policies.tiresias.policy import TiresiasPolicy
from scheduling.policies.tiresias.queues import STATE as TIRESIAS_STATE
from scheduling.policy import Policy
from scheduling.profiling import profile_first
from scheduling.registry import POLICIES, make_policy
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.snapshot import JobState, LayerRecord, Plan, PlanReasons, Snapshot
from simulator.engine import Simulation
from simulator.workloads import SimJob
from tests.forbid_layer import ForbidServer
from tests.helpers import cluster, flat_estimate, state, untimed
from world.catalog import builtin_catalog
from world.truth import GroundTruth

BARE: dict[str, type[LayeredPolicy]] = {"hops": HopsPolicy, "sia": SiaPolicy, "gavel": GavelPolicy,
                                        "slurm": SlurmPolicy, "tiresias": TiresiasPolicy,
                                        "themis": ThemisPolicy}


def servers_used(plan: Plan) -> set[ServerId]:
    used = {sid for a in plan.assignments for sid in a.config.servers}
    return used | {t.server for t in plan.profiling}


def small_cluster() -> Cluster:
    rtx = GpuType("RTX3090")
    spec = GpuTypeSpec(rtx, link_bandwidth=2.5e9, net_bandwidth=1e9)
    return Cluster(
        gpu_types=(spec,),
        servers=tuple(
            Server(ServerId(f"n{i}"), rtx, 4, model="TIGERWAY YK8100-8G") for i in range(3)
        ),
    )


@pytest.mark.parametrize("name", ["hops", "sia", "gavel", "slurm", "tiresias", "themis"])
def test_a_layer_from_a_test_runs_unchanged_in_the_simulator(name: str) -> None:
    c = small_cluster()
    jobs = [
        SimJob(
            spec=JobSpec(
                JobId(f"j{i}"), "resnet18-cifar10", 256, 11_181_642, 200_000,
                requirements=(1, 2, 4), submit_time=60.0 * i,
            ),
            model="resnet18-cifar10",
        )
        for i in range(6)
    ]
    layer = ForbidServer(ServerId("n1"))
    result = Simulation(
        c, jobs, stack(make_policy(name), layer), GroundTruth(c, builtin_catalog())
    ).run()
    assert len(result.jobs) == 6 and all(j.finish is not None for j in result.jobs)
    assert any(p.assignments for p in layer.plans) and any(p.profiling for p in layer.plans)
    assert all(ServerId("n1") not in servers_used(p) for p in layer.plans)
    names = {tuple(r.name for r in p.reasons.layers) for p in layer.plans}
    # outermost first; then the policy's own state, innermost (Sia's measurements)
    assert names == {("forbid-server", "profiling-first", *OWN_STATE.get(name, ()))}
    assert {p.reasons.policy for p in layer.plans} == {name}


# Policies that keep state between plans in a record of their own.
OWN_STATE = {"sia": (SIA_STATE,), "tiresias": (TIRESIAS_STATE,), "themis": (THEMIS_STATE,)}


def mixed_snapshot(first_plan: bool = True) -> Snapshot:
    c = cluster([("A", 2, 4), ("B", 1, 4)])
    jobs = (
        state("new", [1], phase="profiling", unprofiled=["A", "B"]),
        state("late", [1], submit=5.0, phase="profiling", unprofiled=["A"]),
        state("q", [2, 4], wait_s=100.0),
        JobState(
            spec=state("r", [4]).spec, phase="running", current=Configuration.of({"A-0": 4})
        ),
    )
    ests = {JobId(j): flat_estimate(j, {"A": 100.0, "B": 150.0}) for j in ("q", "r")}
    held = {} if first_plan else {ServerId("A-0"): 4}
    return Snapshot(
        now=600.0, cluster=c, jobs=jobs, estimates=ests, held=held, first_plan=first_plan
    )


@pytest.mark.parametrize("first_plan", [True, False])
@pytest.mark.parametrize("name", ["hops", "sia", "gavel", "slurm", "tiresias", "themis"])
def test_profiling_first_serves_the_queue_then_the_policy_on_the_rest(
    name: str, first_plan: bool
) -> None:
    snap = mixed_snapshot(first_plan)
    layered = make_policy(name)
    assert isinstance(layered, BARE[name])  # the registry's policy, in its layer
    plan = layered.plan(snap)
    tasks, left = profile_first(snap)
    assert list(plan.profiling) == tasks and tasks  # the same queue for every policy
    # The policy beneath plans on exactly the GPUs the profiling runs left.
    taken: Counter[ServerId] = Counter()
    for t in tasks:
        taken[t.server] += t.gpus
    view = hold(snap, taken)
    assert view.free_gpus() == left
    view = msgspec.structs.replace(view, profiling_held=dict(taken))
    bare = BARE[name]().plan(view)
    assert untimed(msgspec.structs.replace(plan, profiling=(), reasons=bare.reasons)) == untimed(
        bare
    )
    (record, *own) = plan.reasons.layers
    assert record.name == "profiling-first" and record.held == dict(taken)
    assert tuple(r.name for r in own) == OWN_STATE.get(name, ())
    assert plan.reasons.policy == name and bare.profiling == ()
    for a in plan.assignments:
        for sid, g in a.config.parts:
            assert g <= left[sid]


@pytest.mark.parametrize("name", POLICIES)
def test_the_registry_wraps_every_policy_in_profiling_first(name: str) -> None:
    policy = make_policy(name)
    assert isinstance(policy, LayeredPolicy)
    (layer,) = policy.layers
    assert isinstance(layer, ProfilingFirst)
    assert layer.settings == ProfilingSettings(preempt=name == "hops-profile-preempt")


def test_the_profiling_layer_takes_its_settings_from_the_spec() -> None:
    snap = mixed_snapshot()
    jobs = (
        JobState(spec=state("r", [4]).spec, phase="running", current=Configuration.of({"B-0": 4})),
        state("new", [1], phase="profiling", unprofiled=["B"]),
    )
    busy = msgspec.structs.replace(snap, jobs=jobs, estimates={})
    assert make_policy("sia").plan(busy).profiling == ()  # idle GPUs only
    eager = make_policy("sia:profile_preempt=true,profile_gpus=2").plan(busy)
    assert [(t.job_id, t.server, t.gpus) for t in eager.profiling] == [("new", "B-0", 2)]


def test_hold_back_and_plan_groups_restrict_jobs_and_servers() -> None:
    c = cluster([("A", 2, 4)])
    jobs = (state("x", [4]), state("y", [4]), state("z", [4]))
    ests = {JobId(j): flat_estimate(j, {"A": 100.0}) for j in ("x", "y", "z")}
    snap = Snapshot(now=10.0, cluster=c, jobs=jobs, estimates=ests)
    hops = HopsPolicy()
    held = hops.plan(hold_back(snap, {JobId("x")}))
    assert held.config_of(JobId("x")) is None
    # One call per tenant, on its own servers (HiveD's intra-VC scheduling).
    groups = [({JobId("x")}, {ServerId("A-1")}), ({JobId("y"), JobId("z")}, {ServerId("A-0")})]
    plan = plan_groups(snap, groups, hops)
    assert plan.config_of(JobId("x")) == Configuration.of({"A-1": 4})
    placed = [j for j in ("y", "z") if plan.config_of(JobId(j)) is not None]
    assert len(placed) == 1 and plan.config_of(JobId(placed[0])) == Configuration.of({"A-0": 4})
    assert plan.reasons.policy == "hops" and len(plan.reasons.passes) >= 2


class NoJob:
    """Post-processes the inner plan: one job never gets an assignment."""

    name = "no-job"

    def __init__(self, job_id: JobId) -> None:
        self.job_id = job_id

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan, removed = drop(inner.plan(snapshot), lambda j: j != self.job_id)
        return annotate(plan, LayerRecord(self.name, removed=removed))


def test_a_layer_post_processes_the_inner_plan() -> None:
    snap = mixed_snapshot()
    base = make_policy("hops").plan(snap)
    assert base.config_of(JobId("q")) is not None
    plan = stack(make_policy("hops"), NoJob(JobId("q"))).plan(snap)
    assert plan.config_of(JobId("q")) is None
    assert plan.assignments == tuple(a for a in base.assignments if a.job_id != "q")
    assert [(r.name, r.removed) for r in plan.reasons.layers] == [
        ("no-job", ("q",)), ("profiling-first", ()),
    ]


def test_layer_records_travel_and_old_reasons_still_decode() -> None:
    plan = make_policy("gavel").plan(mixed_snapshot())
    assert msgspec.json.decode(msgspec.json.encode(plan), type=Plan) == plan
    old = b'{"policy": "hops", "priorities": {"q": 1.5}}'  # written before layers
    reasons = msgspec.json.decode(old, type=PlanReasons)
    assert reasons.layers == () and reasons.priorities == {"q": 1.5}
