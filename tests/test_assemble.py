"""The one snapshot assembler (scheduling/assemble.py) the live leader and the
simulator share, and the one plan check (scheduling/check.py) both run."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.assemble import Assembled, Holder, assemble
from scheduling.check import plan_overallocation
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.resources import Resources
from shared.snapshot import Assignment, JobState, Plan, ProfilingTask
from tests.helpers import flat_estimate
from tests.helpers import state as job_state

A = GpuType("A")
S0, S1 = ServerId("s0"), ServerId("s1")
CLUSTER = Cluster(
    gpu_types=(GpuTypeSpec(A, link_bandwidth=2.5e9, net_bandwidth=1e9),),
    servers=(Server(S0, A, 4, cores=8), Server(S1, A, 4, cores=8)),
)
RUN = Configuration(((S0, 2),), (Resources(cores=2),))  # 2 GPUs, 2 cores on s0
CPU = Configuration(((S1, 0),), (Resources(cores=3),))  # a CPU job: 3 cores on s1


def running(job_id: str, config: Configuration) -> JobState:
    return msgspec.structs.replace(job_state(job_id, (config.total_gpus or 1,)),
                                   phase="running", current=config)


def cpu_job() -> JobState:
    spec = JobSpec(JobId("cpu"), "m", 32, 10_000_000, 1000, kind="cpu", cores=3)
    return JobState(spec=spec, phase="running", current=CPU)


def example() -> list[Holder]:
    """A running GPU job, a job whose profiling run holds a GPU of s1, and a
    running CPU job with cores; an ended job's placement and a profiling task
    not booked yet come apart."""
    return [
        Holder(running("run", RUN), RUN),
        Holder(job_state("prof", (1,), phase="profiling", unprofiled=("A",)),
               Configuration(((S1, 1),))),
        Holder(cpu_job(), CPU),
    ]


def build(first_plan: bool, plans_cores: bool,
          estimated: tuple[str, ...] = ("run", "prof")) -> Assembled:
    return assemble(
        10.0, CLUSTER, example(), {JobId(j): flat_estimate(j, {"A": 1.0}) for j in estimated},
        first_plan=first_plan, plans_cores=plans_cores,
        pinned=[Configuration(((S0, 1),))],  # an ended job's placement
        pinned_gpus={S0: 1},  # a profiling task issued, not booked yet
        profiling={S0: 1, S1: 1},
    )


def test_a_first_plan_replans_running_jobs_and_hides_cpu_jobs_from_a_gpu_policy() -> None:
    snap, sticky = build(first_plan=True, plans_cores=False)
    assert [j.id for j in snap.jobs] == ["run", "prof"]
    assert snap.held == {S0: 2, S1: 1}  # ended job + unbooked task; the profiling run
    assert snap.held_extras == {S1: Resources(cores=3)}  # the hidden CPU job keeps its cores
    assert snap.profiling_held == {S0: 1, S1: 1}
    assert sticky == {JobId("cpu"): CPU}
    assert set(snap.estimates) == {"run"}  # not the profiling job's


def test_a_later_plan_holds_what_every_running_job_holds() -> None:
    snap, sticky = build(first_plan=False, plans_cores=True)
    assert [j.id for j in snap.jobs] == ["run", "prof", "cpu"]
    assert snap.held == {S0: 4, S1: 1}
    assert snap.held_extras == {S0: Resources(cores=2), S1: Resources(cores=3)}
    assert sticky == {}


def test_a_running_job_without_an_estimate_is_kept_where_it_is_in_a_first_plan() -> None:
    snap, sticky = build(first_plan=True, plans_cores=True, estimated=("prof",))
    assert [j.id for j in snap.jobs] == ["prof", "cpu"]
    assert sticky == {JobId("run"): RUN}
    assert snap.held == {S0: 4, S1: 1}
    assert snap.held_extras == {S0: Resources(cores=2)}


@st.composite
def consistent(draw: st.DrawFn) -> tuple[list[Holder], dict[ServerId, int], bool, bool]:
    """Holders and profiling tasks that together fit the cluster, as the
    records of a consistent cluster do."""
    free = {s.id: s.gpus for s in CLUSTER.servers}
    holders: list[Holder] = []
    for i in range(draw(st.integers(0, 6))):
        sid = draw(st.sampled_from([S0, S1]))
        if not free[sid]:
            continue
        gpus = draw(st.integers(1, free[sid]))
        free[sid] -= gpus
        config = Configuration(((sid, gpus),))
        phase = draw(st.sampled_from(["running", "queued", "profiling"]))
        state = (running(f"j{i}", config) if phase == "running"
                 else job_state(f"j{i}", (gpus,), phase=phase))
        holders.append(Holder(state, config))
    tasks = {sid: draw(st.integers(0, free[sid])) for sid in free}
    return holders, tasks, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=200, deadline=None)
@given(consistent())
def test_no_server_shows_more_held_than_it_has(
    case: tuple[list[Holder], dict[ServerId, int], bool, bool],
) -> None:
    holders, tasks, first_plan, estimated = case
    estimates = {h.state.id: flat_estimate(h.state.id, {"A": 1.0}) for h in holders
                 if estimated}
    snap = assemble(0.0, CLUSTER, holders, estimates, first_plan=first_plan,
                    pinned_gpus=tasks, profiling=tasks).snapshot
    for server in CLUSTER.servers:
        assert snap.held.get(server.id, 0) <= server.gpus
        assert snap.profiling_held.get(server.id, 0) <= snap.held.get(server.id, 0)
    assert all(snap.free_resources()[s.id].gpus >= 0 for s in CLUSTER.servers)
    # what a later plan shows held is all the holders and tasks hold
    if not first_plan:
        total = sum(h.holds.total_gpus for h in holders if h.holds) + sum(tasks.values())
        assert sum(snap.held.values()) == total


def test_the_plan_check_refuses_a_plan_that_double_books_a_gpu() -> None:
    snap, _ = build(first_plan=True, plans_cores=True)
    fits = Plan((Assignment(JobId("run"), Configuration(((S0, 2),))),))
    assert plan_overallocation(snap, fits) is None
    # s0 has 4 GPUs, 2 held: a profiling run on top of "run"'s two is one too many
    task = ProfilingTask(JobId("prof"), A, S0)
    why = plan_overallocation(snap, Plan(fits.assignments, (task,)))
    assert why == "profiling prof on s0: s0 has 0 GPUs free of 4, 1 needed"
