"""The one job lifecycle (scheduling/lifecycle.py) that the simulator
and the live scheduler share: random event sequences, refused events, no
fall-through for an event type it does not know, and the simulator's events."""

from __future__ import annotations

import heapq
import typing

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import lifecycle as lc
from scheduling.live.state import Facts, apply_event, life_of
from scheduling.registry import make_policy
from shared import events as ev
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport
from simulator import events as sim
from simulator.engine import Simulation
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.truth import GroundTruth

J = JobId("j")
SPEC = JobSpec(J, "resnet50", 32, 1_000_000, 1000, requirements=(1, 2))
CONFIGS = (Configuration.of({"a0": 1}), Configuration.of({"a0": 2}), Configuration.of({"b0": 1}))
STARTS = (ev.JobStarted, ev.JobResized)


def _event(kind: int, config: int, at: float) -> lc.Transition:
    """One of the lifecycle's thirteen kinds of transition."""
    c = CONFIGS[config]
    options: tuple[lc.Transition, ...] = (
        ev.JobSubmitted(job_id=J, spec=SPEC, at=at),
        ev.JobProfiled(job_id=J, gpu_types=(GpuType("A"),), at=at),
        ev.JobStarted(job_id=J, configuration=c, at=at),
        ev.JobResized(job_id=J, configuration=c, at=at),
        ev.JobStopped(job_id=J, at=at),
        ev.JobFinished(job_id=J, at=at),
        ev.JobFailed(job_id=J, at=at, reason="boom"),
        ev.JobCancelled(job_id=J, at=at),
        lc.Profile(job_id=J, at=at),
        lc.Queue(job_id=J, at=at),
        lc.Retune(job_id=J, configuration=c, at=at),
        ev.JobHeld(job_id=J, at=at),
        ev.JobReleased(job_id=J, at=at),
    )
    return options[kind]


# Finishing is rare in a random sequence that wants to see long lives: the
# three final kinds are drawn less often than the others.
KINDS = st.sampled_from([0, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, 8, 9, 9])
SEQUENCES = st.lists(st.tuples(KINDS, st.integers(0, len(CONFIGS) - 1)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(SEQUENCES)
def test_random_event_sequences_keep_the_lifecycle_invariants(
    seq: list[tuple[int, int]],
) -> None:
    life: lc.Life | None = None
    starts = 0
    first: float | None = None
    ended_at: float | None = None
    for i, (kind, config) in enumerate(seq):
        event = _event(kind, config, float(i))
        outcome = lc.step(life, event)
        if isinstance(outcome, lc.Refused):
            assert outcome.reason  # a refusal always says why
            continue
        if life is not None and life.final:
            pytest.fail(f"a {life.phase} job accepted {type(event).__name__}")
        if isinstance(event, STARTS):
            starts += 1
            first = event.at if first is None else first
            assert outcome.phase == "running" and outcome.configuration == event.configuration
        life = outcome
        # Restarts: one per accepted start or resize, the first start included.
        assert (life.restarts, life.first_start) == (starts, first)
        # A job holds a configuration while it runs, and only then (at most one).
        assert (life.configuration is not None) == (life.phase == "running")
        if life.final:
            ended_at = event.at if ended_at is None else ended_at
            assert life.finished_at == ended_at
    if life is not None and life.final:
        # A finished, failed or cancelled job never runs again: nothing moves it.
        for kind in range(10):
            assert isinstance(lc.step(life, _event(kind, 0, 1e9)), lc.Refused)


@settings(max_examples=150, deadline=None)
@given(SEQUENCES)
def test_the_live_record_follows_the_lifecycle(seq: list[tuple[int, int]]) -> None:
    # Profiles on A never cover A and B: the leader's own promotion stays out.
    facts = Facts({ServerId("a0"): GpuType("A")}, frozenset({GpuType("A"), GpuType("B")}))
    rec = None
    life: lc.Life | None = None
    for i, (kind, config) in enumerate(seq, 1):
        event = _event(kind, config, float(i))
        if isinstance(event, lc.Profile | lc.Queue):
            continue  # the leader's decisions are not stream events
        outcome = lc.step(life, event)
        applied = apply_event(rec, event, i, facts)
        assert isinstance(outcome, lc.Refused) == bool(applied.note)
        rec, life = applied.record or rec, outcome if isinstance(outcome, lc.Life) else life
        assert (None if rec is None else life_of(rec)) == life


def _life(*events: lc.Transition) -> lc.Life:
    life: lc.Life | None = None
    for event in events:
        outcome = lc.step(life, event)
        assert isinstance(outcome, lc.Life), outcome
        life = outcome
    assert life is not None
    return life


SUBMITTED = ev.JobSubmitted(job_id=J, spec=SPEC, at=0.0)
QUEUED = (SUBMITTED, lc.Profile(job_id=J), lc.Queue(job_id=J))


def test_refused_events_say_why() -> None:
    start = ev.JobStarted(job_id=J, configuration=CONFIGS[0], at=1.0)
    assert lc.step(None, start) == lc.Refused("unknown job")
    assert lc.step(_life(SUBMITTED), SUBMITTED) == lc.Refused("already submitted")
    # Starts and stops while profiling are the profiling runs' (§3.2).
    assert lc.step(_life(SUBMITTED), start) == lc.Refused(lc.PROFILING_RUN)
    profiling = _life(SUBMITTED, lc.Profile(job_id=J))
    assert lc.step(profiling, ev.JobStopped(job_id=J, at=1.0)) == lc.Refused(lc.PROFILING_RUN)
    assert lc.step(profiling, lc.Profile(job_id=J)) == lc.Refused(
        "job is profiling, not waiting"
    )
    running = _life(*QUEUED, start)
    assert lc.step(running, lc.Queue(job_id=J)) == lc.Refused("job is running, not being profiled")
    assert lc.step(running, lc.Profile(job_id=J)) == lc.Refused("job is running, not waiting")
    for end in (ev.JobFinished, ev.JobCancelled):
        done = _life(*QUEUED, start, end(job_id=J, at=2.0))
        assert lc.step(done, start) == lc.Refused(f"job is {done.phase}")
        assert done.configuration is None and done.finished_at == 2.0


def test_one_restart_per_start_the_first_included() -> None:
    a, b = CONFIGS[0], CONFIGS[2]
    life = _life(
        *QUEUED,
        ev.JobStarted(job_id=J, configuration=a, at=1.0),
        ev.JobResized(job_id=J, configuration=b, at=2.0),
        ev.JobStopped(job_id=J, at=3.0),
        ev.JobStopped(job_id=J, at=3.5),  # a release that crossed the placer's stop
        ev.JobStarted(job_id=J, configuration=a, at=4.0),
    )
    assert (life.phase, life.configuration, life.restarts, life.first_start) == (
        "running", a, 3, 1.0,
    )


class JobPaused(msgspec.Struct, frozen=True, tag="job_paused"):
    """An event type the lifecycle does not know (not a ``shared.events.Message``:
    a subclass of that would join the wire contract for every test after this one)."""

    job_id: JobId
    at: float


def test_an_unknown_event_type_raises_instead_of_moving_the_job() -> None:
    queued = _life(*QUEUED)
    for stranger in (JobPaused(job_id=J, at=1.0), object()):
        with pytest.raises(AssertionError):
            lc.step(queued, stranger)  # type: ignore[arg-type]
    # The live shell used to cancel a job on any event it did not know.
    facts = Facts({ServerId("a0"): GpuType("A")}, frozenset({GpuType("A")}))
    rec = apply_event(None, SUBMITTED, 1, facts).record
    with pytest.raises(AssertionError):
        apply_event(rec, JobPaused(job_id=J, at=1.0), 2, facts)  # type: ignore[arg-type]


def test_every_kind_of_transition_has_a_case() -> None:
    # The union's members, each stepped from a waiting job: none falls to
    # the ``assert_never`` branch (mypy checks the same statically).
    members = set(typing.get_args(lc.Transition))
    assert members == set(typing.get_args(ev.JobEvent)) | {lc.Profile, lc.Queue, lc.Retune}
    seen = {type(_event(k, 0, 1.0)) for k in range(13)}
    assert seen == members
    for kind in range(13):
        lc.step(_life(*QUEUED), _event(kind, 0, 1.0))


def test_the_live_record_counts_restarts_as_the_lifecycle() -> None:
    facts = Facts({ServerId("a0"): GpuType("A")}, frozenset({GpuType("A")}))
    events: list[ev.JobEvent] = [
        SUBMITTED,
        ev.JobProfiled(job_id=J, gpu_types=(GpuType("A"),), at=1.0),
        ev.JobStarted(job_id=J, configuration=CONFIGS[0], at=2.0),
        ev.JobResized(job_id=J, configuration=CONFIGS[1], at=3.0),
    ]
    rec = None
    for seq, event in enumerate(events, 1):
        rec = apply_event(rec, event, seq, facts).record or rec
    assert rec is not None and (rec.phase, rec.restarts, rec.configuration) == (
        "running", 2, CONFIGS[1],
    )


def test_simulator_events_are_a_tagged_union_and_profile_ends_order_by_time() -> None:
    report = ProfileReport(job_id=J, gpu_type=GpuType("A"), server_id=ServerId("a0"))
    late = sim.ProfileEnd(5.0, JobId("a"), ServerId("a0"), report)
    early = sim.ProfileEnd(1.0, JobId("z"), ServerId("z9"), report)
    heap = [late, early]
    heapq.heapify(heap)
    assert heapq.heappop(heap) is early
    decoded = msgspec.json.decode(msgspec.json.encode(sim.FillPlan(3.0)), type=sim.Event)
    assert decoded == sim.FillPlan(3.0)


def test_the_simulator_moves_jobs_through_the_lifecycle() -> None:
    rtx = GpuType("RTX3090")
    cluster = Cluster(
        gpu_types=(GpuTypeSpec(rtx, link_bandwidth=2.5e9, net_bandwidth=1e9),),
        servers=(Server(ServerId("n0"), rtx, 4, model="TIGERWAY YK8100-8G"),),
    )
    spec = JobSpec(JobId("a"), "resnet18-cifar10", 256, 11_181_642, 100_000, requirements=(1, 2))
    engine = Simulation(
        cluster, [SimJob(spec=spec, model=spec.model)], make_policy("hops"),
        GroundTruth(cluster, builtin_catalog()),
    )
    (a,) = engine.run().jobs
    life = engine.jobs[JobId("a")].life
    assert life is not None and life.phase == "finished" and life.configuration is None
    assert (a.restarts, a.first_start, a.finish) == (
        life.restarts, life.first_start, life.finished_at,
    )
    assert a.restarts >= 1  # its first start is a restart
    with pytest.raises(AssertionError):  # no kind of event falls through
        engine._handle(object())  # type: ignore[arg-type]


def test_a_retune_changes_cores_in_place_and_counts_no_restart() -> None:
    from shared.resources import Resources

    base = Configuration.of({"a0": 2})
    more = base.with_extras({ServerId("a0"): Resources(cores=6)})
    life = lc.Life(phase="running", configuration=base, restarts=1, first_start=0.0)
    after = lc.step(life, lc.Retune(job_id=J, configuration=more, at=5.0))
    assert isinstance(after, lc.Life)
    assert after.configuration == more and after.restarts == 1
    moved = Configuration.of({"a0": 1}).with_extras({ServerId("a0"): Resources(cores=3)})
    assert isinstance(lc.step(life, lc.Retune(job_id=J, configuration=moved, at=5.0)),
                      lc.Refused)
    queued = lc.Life(phase="queued")
    assert isinstance(lc.step(queued, lc.Retune(job_id=J, configuration=more, at=5.0)),
                      lc.Refused)
