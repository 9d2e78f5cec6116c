"""Parity: the live system plans as the simulator does.

The same three jobs (different models of ``world/catalog.py``, all
submitted at time 0) on the same cluster go through the simulator
(:class:`simulator.engine.Simulation` with :class:`HopsPolicy`, as
``hops simulate`` runs it) and through the live system (every component
its own process, :mod:`tests.livestack`); the first plan that carries
assignments must give every job the same configuration in both. Both sides
profile with the same ground truth (``world.truth.GroundTruth``), each
with its own noise.

A unit test here also holds the live snapshot to one rule of the
simulator's that the live system has to work for (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from scheduling.live.clock import Inflight
from scheduling.live.snapshot import build_snapshot
from scheduling.live.state import LiveJobRecord, new_record, running_configs
from scheduling.policies.hops.policy import HopsPolicy
from scheduling.registry import make_policy
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord, Placement
from shared.snapshot import Plan, Snapshot
from simulator.engine import Simulation
from simulator.settings import SimSettings
from simulator.workloads import SimJob
from tests.helpers import flat_estimate
from tests.livestack import LiveStack, until
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.truth import GroundTruth

CLUSTER = """\
name: parity
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 8}
"""
# (job, catalog model, samples, requirement set)
WORKLOAD = (
    ("par-resnet", "resnet50-cifar10", 10**9, (4, 8)),
    ("par-vgg", "vgg11-cifar10", 10**9, (1, 2)),
    ("par-bert", "distilbert-imdb", 10**8, (1, 2)),
)
Pairs = set[tuple[str, tuple[tuple[str, int], ...]]]


def specs() -> list[dict[str, Any]]:
    catalog = builtin_catalog()
    return [
        {"id": job, "model": model, "batch_size": catalog[model].batch_size,
         "params": catalog[model].params, "total_samples": samples, "requirements": list(reqs)}
        for job, model, samples, reqs in WORKLOAD
    ]


class _FirstAssignments(Exception):
    def __init__(self, plan: Plan) -> None:
        self.plan = plan


class _Stop:
    """HopsPolicy, stopping the simulation at its first plan with assignments."""

    name = "hops"

    def __init__(self) -> None:
        self.policy = make_policy("hops")  # as the simulator and the leader get it

    def plan(self, snapshot: Snapshot) -> Plan:
        plan = self.policy.plan(snapshot)
        if plan.assignments:
            raise _FirstAssignments(plan)
        return plan


def simulated(cluster_file: Path, seed: int) -> Pairs:
    cluster = cluster_arg(str(cluster_file))
    truth = GroundTruth(cluster, builtin_catalog())
    jobs = [SimJob(msgspec.convert(s, JobSpec), s["model"]) for s in specs()]
    try:
        Simulation(cluster, jobs, _Stop(), truth, SimSettings(seed=seed)).run()
    except _FirstAssignments as first:
        return {(a.job_id, a.config.parts) for a in first.plan.assignments}
    raise AssertionError("the simulation made no plan with assignments")


def test_the_live_first_plan_is_the_simulators(tmp_path: Path) -> None:
    """Why this workload: its plan does not depend on the priorities, which
    differ between the two sides (waits are simulated seconds there, wall
    seconds of an emulation at x600 here, and which job's profiling ends
    first is up to the processes here): the ResNet-50 is best on eight
    TitanXPs (an option only it has), which no other job wants, and the VGG
    and the DistilBERT both fit at their largest on the four RTX3090s. Nor
    does it depend on the profiling noise: the simulator gives the same plan
    for every seed tried (three here; 305 of 305 trials over seeds, waits
    from 0 to 30 s and first or later plans when the workload was chosen).
    The live round is long (300 s) so that, as in the simulator, the first
    plan with assignments is one later in the round (§3.6); it comes 3 s
    after the first job is profiled (``HOPS_REPLAN_DELAY_S``), time for the
    other profiling runs to end as well."""
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(CLUSTER)
    expected = simulated(cluster_file, seed=0)
    assert {job for job, _ in expected} == {job for job, *_ in WORKLOAD}, expected
    assert all(simulated(cluster_file, seed) == expected for seed in (1, 2))
    env = {"HOPS_REPLAN_DELAY_S": "3"}
    with LiveStack(tmp_path / "live", CLUSTER, schedulers=1, round_s=300, env=env) as stack:
        for spec in specs():
            assert stack.submit(spec)["ok"] is True
        bus = stack.bus_()
        plan = until(lambda: next((p for p in bus.plans() if p["plan"]["assignments"]), None),
                     "a plan with assignments", 60, stack.logs)
        live = {(a["job_id"], tuple((s, g) for s, g in a["config"]["parts"]))
                for a in plan["plan"]["assignments"]}
        profiled = {t["job_id"] for p in bus.plans() for t in p["plan"]["profiling"]}
    assert profiled == {job for job, *_ in WORKLOAD}
    assert plan["first_plan"] is False
    assert live == expected, f"live {sorted(live)}\nsimulated {sorted(expected)}"


# --- a rule of the simulator's for the live snapshot ---------------------------------

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
NODES = [
    NodeRecord(server=Server(ServerId(s), A.name, 4), gpu_type=A, order=i)
    for i, s in enumerate(("a0", "a1"))
]


def record(job_id: str, phase: str, reqs: Sequence[int], **kw: object) -> LiveJobRecord:
    spec = JobSpec(JobId(job_id), "m", 32, 1_000_000, 10**9, requirements=tuple(reqs))
    return msgspec.structs.replace(new_record(spec, 0.0), phase=phase, **kw)


def config(**parts: int) -> Configuration:
    return Configuration(tuple((ServerId(s), g) for s, g in sorted(parts.items())))


def test_a_start_in_flight_runs_where_it_starts_in_a_first_plan() -> None:
    """In the simulator a job runs from the plan that starts it. Live, the
    placer may still be starting it when the next round's first plan is made
    (the emulated job process takes a second or more to start); that plan
    must see the job running where it is starting, as the simulator would,
    and replan it as a running job: its GPUs are the planner's, and moving
    it costs a restart (``reconfig_cost``). Seeing it queued instead, the
    plan moved it whenever another placement had become as good, and the
    next one could move it back (observed: two jobs swapping servers every
    round)."""
    estimates = {JobId(j): flat_estimate(j, {"A": 100.0}) for j in ("r", "w")}
    records = {
        JobId("r"): record("r", "running", (4,), configuration=config(a0=4)),
        JobId("w"): record("w", "queued", (2,)),
    }
    allocs = {JobId("r"): Placement(job_id=JobId("r"), configuration=config(a0=4),
                                    gpu_indices={})}
    inflight = Inflight(grace_s=60.0)
    fill = build_snapshot(1.0, records, NODES, allocs, estimates, {}, inflight, False).snapshot
    plan = HopsPolicy().plan(fill)
    assert [(a.job_id, a.config) for a in plan.assignments] == [("w", config(a1=2))]
    inflight.note_plan(plan, 1.0, False, running_configs(records.values()))
    # r ends; w's start is not booked yet when the next round begins.
    records[JobId("r")] = msgspec.structs.replace(records[JobId("r")], phase="finished")
    first = build_snapshot(2.0, records, NODES, {}, estimates, {}, inflight, True).snapshot
    (w,) = first.jobs
    assert (w.phase, w.current, first.held) == ("running", config(a1=2), {})
    assert HopsPolicy().plan(first).config_of(JobId("w")) == config(a1=2)
    # Had the start been forgotten, the job would have been moved to a0.
    forgot = build_snapshot(2.0, records, NODES, {}, estimates, {}, Inflight(60.0), True)
    assert HopsPolicy().plan(forgot.snapshot).config_of(JobId("w")) == config(a0=2)
