"""The live scheduler's pure parts: the leader lease, job-record transitions,
snapshots and the queue view, round timing, admission decisions and the
settings. No NATS here (the profile tracker's tests are with the profiler's)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.live import admission as adm
from scheduling.live.clock import Inflight, RoundClock
from scheduling.live.lease import (
    Create,
    Lease,
    LeaseValue,
    Observed,
    Refresh,
    Wait,
    decode_value,
    encode_value,
    lease_stall,
    lease_ttl,
)
from scheduling.live.snapshot import (
    build_snapshot,
    cluster_of,
    estimate_requests,
    facts,
    queue_view,
    topology,
    with_sticky,
)
from scheduling.live.state import (
    Facts,
    LiveJobRecord,
    apply_event,
    counts_progress,
    decode_record,
    encode_record,
    mark_profiling,
    new_record,
    promote,
    running_configs,
    wants_plan,
)
from scheduling.policies.hops.policy import HopsPolicy
from scheduling.registry import make_policy
from services.runtime.settings import SettingsError
from services.scheduler.settings import SchedulerSettings, scheduler_settings
from shared import events as ev
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.records import JobRecord, NodeRecord, Placement
from shared.snapshot import JobState, Plan, ProfilingTask
from tests.helpers import assert_feasible, flat_estimate

# --- the lease -------------------------------------------------------------------


def test_a_follower_creates_an_absent_lease_and_its_term_is_the_revision() -> None:
    lease = Lease("a", ttl=9.0)
    assert lease.interval == 3.0 and lease.horizon == 6.0
    action = lease.action(100.0, None)
    assert isinstance(action, Create) and action.value.holder == "a"
    assert lease.written(action, 41, 100.0) == "elected"
    assert (lease.role, lease.term, lease.revision) == ("leader", 41, 41)
    refresh = lease.action(103.0, None)
    assert refresh == Refresh(
        LeaseValue(holder="a", term=41, acquired_at=100.0, refreshed_at=103.0), 41
    )
    assert lease.written(refresh, 44, 103.0) is None and lease.term == 41
    assert lease.is_leader(108.9) and not lease.is_leader(109.0)


def test_a_held_lease_makes_a_follower_wait() -> None:
    lease = Lease("b", ttl=3.0)
    held = Observed(LeaseValue(holder="a", term=7), 9)
    assert lease.action(1.0, held) == Wait("a")
    assert lease.role == "follower" and not lease.is_leader(1.0)
    assert Observed.of(b"not json", 3).value.holder == "?"
    assert decode_value(encode_value(held.value)) == held.value


def test_the_leader_steps_down_on_a_failed_write_or_when_its_lease_may_have_lapsed() -> None:
    lease = Lease("a", ttl=3.0)
    lease.written(Create(LeaseValue(holder="a")), 5, 0.0)
    assert lease.failed() == "deposed" and lease.role == "follower"
    assert lease.failed() is None  # a follower's failed create changes nothing
    lease.written(Create(LeaseValue(holder="a")), 8, 10.0)
    assert lease.check(11.9) is None
    assert lease.check(12.0) == "deposed"
    lease.written(Create(LeaseValue(holder="a")), 9, 20.0)
    assert lease.release() == 9 and lease.role == "follower" and lease.release() is None
    with pytest.raises(ValueError, match="ttl"):
        Lease("a", 0.0)


def test_on_a_cluster_the_lease_rides_out_an_election_but_not_a_conflict() -> None:
    ttl, stall = lease_ttl(5.0, replicated=True), lease_stall(True)
    assert (ttl, stall) == (12.5, 8.0) and (lease_ttl(5.0, False), lease_stall(False)) == (5.0, 0)
    lease = Lease("a", ttl, stall)
    assert lease.interval == 1.5 and lease.horizon == 11.0
    lease.written(Create(LeaseValue(holder="a")), 5, 0.0)
    # a refresh due at 1.5 s that stalls a whole election still lands in time
    assert lease.interval + stall < lease.horizon
    assert lease.write_budget(1.5) == 9.5
    assert lease.failed(conflict=False) is None and lease.is_leader(10.9)
    assert lease.check(11.0) == "deposed"  # an election longer than measured: the horizon
    lease.written(Create(LeaseValue(holder="a")), 9, 20.0)
    assert lease.failed(conflict=True) == "deposed"
    assert Lease("b", 5.0).failed(conflict=False) is None  # a follower: nothing to lose
    plain = Lease("c", 5.0)
    plain.written(Create(LeaseValue(holder="c")), 1, 0.0)
    assert plain.failed(conflict=False) == "deposed"  # no stall to ride out: as before
    with pytest.raises(ValueError, match="stall"):
        Lease("a", 5.0, stall=8.0)


class _Kv:
    """A model of the lease key in a bucket with a max age, for the property test."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.seq = 0
        self.entry: tuple[LeaseValue, int, float] | None = None  # value, revision, written

    def live(self, now: float) -> tuple[LeaseValue, int, float] | None:
        if self.entry is not None and now - self.entry[2] >= self.ttl:
            self.entry = None
        return self.entry

    def write(self, action: Create | Refresh, now: float) -> int | None:
        entry = self.live(now)
        ok = (
            entry is None
            if isinstance(action, Create)
            else (entry is not None and entry[1] == action.revision)
        )
        if not ok:
            return None
        self.seq += 1
        self.entry = (action.value, self.seq, now)
        return self.seq


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # which replica ticks
            st.floats(0.0, 2.5),  # time passing before it does
            st.sampled_from(["ok", "lost", "applied-but-lost"]),  # how its write fares
        ),
        max_size=80,
    )
)
def test_at_most_one_leader_at_any_time_and_terms_grow(
    steps: list[tuple[int, float, str]],
) -> None:
    ttl = 3.0
    kv = _Kv(ttl)
    leases = [Lease(f"r{i}", ttl) for i in range(3)]
    now, terms = 0.0, [0]
    for who, dt, fate in steps:
        now += dt
        lease = leases[who]
        lease.check(now)
        entry = kv.live(now)
        observed = Observed(entry[0], entry[1]) if entry else None
        action = lease.action(now, observed)
        if not isinstance(action, Wait):
            revision = kv.write(action, now) if fate != "lost" else None
            if revision is None or fate != "ok":
                lease.failed()
            elif lease.written(action, revision, now) == "elected":
                assert lease.term > terms[-1]
                terms.append(lease.term)
        assert sum(x.is_leader(now) for x in leases) <= 1


# --- job records ------------------------------------------------------------------

TYPES = {ServerId("a0"): GpuType("A"), ServerId("a1"): GpuType("A"), ServerId("b0"): GpuType("B")}
BOTH = frozenset({GpuType("A"), GpuType("B")})


def spec(job_id: str, reqs: Sequence[int] = (1, 2), samples: int = 1000) -> JobSpec:
    return JobSpec(JobId(job_id), "resnet50", 32, 1_000_000, samples, requirements=tuple(reqs))


def facts_(progress: float = 0.0) -> Facts:
    return Facts(TYPES, BOTH, progress)


def cfg(**parts: int) -> Configuration:
    return Configuration.of(parts)


def run(rec: LiveJobRecord | None, *events: ev.JobEvent, start: int = 1) -> LiveJobRecord:
    for seq, event in enumerate(events, start):
        applied = apply_event(rec, event, seq, facts_())
        rec = applied.record or rec
    assert rec is not None
    return rec


def test_a_job_goes_through_its_phases() -> None:
    j = JobId("j")
    rec = run(None, ev.JobSubmitted(job_id=j, spec=spec("j"), at=10.0))
    assert (rec.phase, rec.since, rec.last_seq) == ("submitted", 10.0, 1)
    assert mark_profiling(rec) is not None and mark_profiling(run(rec)) is not None
    rec = run(rec, ev.JobProfiled(job_id=j, gpu_types=(GpuType("A"),), at=20.0), start=2)
    assert (rec.phase, rec.profiled) == ("profiling", ("A",))
    rec = run(rec, ev.JobProfiled(job_id=j, gpu_types=(GpuType("B"),), at=30.0), start=3)
    assert (rec.phase, rec.profiled, rec.since) == ("queued", ("A", "B"), 30.0)
    rec = run(rec, ev.JobStarted(job_id=j, configuration=cfg(a0=2), at=40.0), start=4)
    # The first start counts as a restart, as in the simulator (one lifecycle).
    assert (rec.phase, rec.wait_s, rec.first_start, rec.restarts) == ("running", 10.0, 40.0, 1)
    resized = ev.JobResized(job_id=j, configuration=cfg(a1=1, b0=1), at=50.0, samples_done=120.0)
    rec = run(rec, resized, start=5)
    assert rec.restarts == 2 and rec.attained_by_type == {"A": 20.0} and rec.samples_done == 120.0
    stopped = apply_event(rec, ev.JobStopped(job_id=j, at=60.0), 6, facts_(progress=400.0))
    assert stopped.record is not None
    rec = stopped.record
    assert (rec.phase, rec.samples_done, rec.configuration) == ("queued", 400.0, None)
    assert rec.attained_by_type == {"A": 30.0, "B": 10.0} and rec.attained_gpu_s == 40.0
    assert rec.run_s_by_type == {"A": 20.0, "B": 10.0}
    rec = run(rec, ev.JobStarted(job_id=j, configuration=cfg(b0=1), at=65.0), start=7)
    assert rec.restarts == 3 and rec.wait_s == 15.0 and rec.first_start == 40.0
    stop = ev.JobStopped(job_id=j, at=70.0, samples_done=650.0)
    rec = run(rec, stop, start=8)
    assert (rec.phase, rec.samples_done, rec.attained_gpu_s) == ("queued", 650.0, 45.0)
    rec = run(rec, ev.JobFinished(job_id=j, at=75.0), start=9)
    assert (rec.phase, rec.finished_at, rec.samples_done, rec.final) == (
        "finished",
        75.0,
        1000.0,
        True,
    )
    assert decode_record(encode_record(rec)) == rec
    plain = msgspec.json.decode(encode_record(rec), type=JobRecord)
    assert plain.phase == "finished" and plain.attained_by_type == rec.attained_by_type


def test_events_that_change_nothing() -> None:
    j = JobId("j")
    assert apply_event(None, ev.JobFinished(job_id=j, at=1.0), 1, facts_()).note == "unknown job"
    rec = run(None, ev.JobSubmitted(job_id=j, spec=spec("j"), at=1.0))
    again = apply_event(rec, ev.JobSubmitted(job_id=j, spec=spec("j"), at=1.0), 1, facts_())
    assert again == (None, "already applied")
    # A profiling run's start and stop do not make a job still being profiled run.
    probe = apply_event(rec, ev.JobStarted(job_id=j, configuration=cfg(a0=1), at=2.0), 2, facts_())
    assert probe.note == "profiling run" and probe.record is not None
    assert probe.record.phase == "submitted" and probe.record.last_seq == 2
    done = run(rec, ev.JobCancelled(job_id=j, at=3.0), start=3)
    assert (done.phase, done.reason, done.finished_at) == ("cancelled", "cancelled", 3.0)
    assert apply_event(done, ev.JobCancelled(job_id=j, at=3.0), 3, facts_()) == (
        None, "already applied")
    late = apply_event(done, ev.JobStarted(job_id=j, configuration=cfg(a0=1), at=4.0), 4, facts_())
    assert late.note == "job is cancelled" and late.record is not None
    assert late.record.phase == "cancelled"


def test_an_end_redelivered_after_a_later_event_is_still_applied() -> None:
    # JetStream redelivers a message whose handler failed after later ones:
    # the cancel (seq 3) comes after the profile (seq 4) was applied. A
    # high-water mark alone would drop it, losing an acknowledged cancel.
    j = JobId("j")
    rec = run(None, ev.JobSubmitted(job_id=j, spec=spec("j"), at=1.0))
    profiled = apply_event(rec, ev.JobStarted(job_id=j, configuration=cfg(a0=1), at=2.0), 4,
                           facts_()).record
    assert profiled is not None and profiled.last_seq == 4
    late = apply_event(profiled, ev.JobCancelled(job_id=j, at=3.0), 3, facts_()).record
    assert late is not None and (late.phase, late.last_seq) == ("cancelled", 4)
    # ... once: the same cancel again, or a later end, changes nothing more
    assert apply_event(late, ev.JobCancelled(job_id=j, at=3.0), 3, facts_()).record is None
    assert apply_event(late, ev.JobFinished(job_id=j, at=5.0), 2, facts_()).record is None
    # other events below the mark are still repeats
    assert apply_event(profiled, ev.JobProfiled(job_id=j, gpu_types=(), at=3.0), 3,
                       facts_()) == (None, "already applied")


def test_a_hold_or_release_redelivered_after_a_later_event_is_applied_once() -> None:
    # The hold (seq 3) comes after the start (seq 4) was applied: it is not
    # a repeat, since no hold was applied yet; applied, it counts once.
    j = JobId("j")
    rec = run(None, ev.JobSubmitted(job_id=j, spec=spec("j"), at=1.0))
    later = apply_event(rec, ev.JobProfiled(job_id=j, gpu_types=(), at=2.0), 4, facts_()).record
    assert later is not None and later.last_seq == 4
    held = apply_event(later, ev.JobHeld(job_id=j, at=3.0, reason="maintenance"), 3,
                       facts_()).record
    assert held is not None and held.held and (held.last_seq, held.hold_seq) == (4, 3)
    assert held.reason.startswith("held")
    assert apply_event(held, ev.JobHeld(job_id=j, at=3.0), 3, facts_()) == (
        None, "already applied")
    # A release (seq 6) applied before an older hold (seq 5) comes again:
    # the older hold must not undo the newer release.
    released = apply_event(held, ev.JobReleased(job_id=j, at=6.0), 6, facts_()).record
    assert released is not None and not released.held and released.hold_seq == 6
    assert apply_event(released, ev.JobHeld(job_id=j, at=5.0), 5, facts_()) == (
        None, "already applied")


def test_promotion_needs_every_alive_type_and_some_type() -> None:
    rec = msgspec.structs.replace(new_record(spec("j"), 0.0), profiled=(GpuType("A"),))
    assert promote(rec, frozenset({GpuType("A"), GpuType("B")}), 5.0) is None
    assert promote(rec, frozenset(), 5.0) is None
    up = promote(rec, frozenset({GpuType("A")}), 5.0)
    assert up is not None and (up.phase, up.since) == ("queued", 5.0)
    assert promote(up, frozenset({GpuType("A")}), 6.0) is None


def test_what_calls_for_a_plan_within_the_round() -> None:
    j = JobId("j")
    sub = ev.JobSubmitted(job_id=j, spec=spec("j"), at=0.0)
    rec = new_record(spec("j"), 0.0)
    assert wants_plan(None, rec, sub) and wants_plan(rec, None, sub)
    queued = msgspec.structs.replace(rec, phase="queued")
    prof = ev.JobProfiled(job_id=j, gpu_types=(), at=0.0)
    assert wants_plan(rec, queued, prof)
    assert not wants_plan(queued, queued, prof)
    assert not wants_plan(rec, rec, ev.JobStopped(job_id=j, at=0.0))
    running = msgspec.structs.replace(rec, phase="running", configuration=cfg(a0=1))
    assert running_configs([rec, running]) == {j: cfg(a0=1)}


job_events = st.lists(
    st.one_of(
        st.builds(
            lambda t: ev.JobProfiled(job_id=JobId("j"), gpu_types=t, at=0.0),
            st.lists(st.sampled_from([GpuType("A"), GpuType("B")]), max_size=2).map(tuple),
        ),
        st.just(
            ev.JobStarted(job_id=JobId("j"), configuration=Configuration.of({"a0": 2}), at=0.0)
        ),
        st.just(
            ev.JobResized(job_id=JobId("j"), configuration=Configuration.of({"b0": 1}), at=0.0)
        ),
        st.just(ev.JobStopped(job_id=JobId("j"), at=0.0)),
        st.just(ev.JobFinished(job_id=JobId("j"), at=0.0)),
        st.just(ev.JobFailed(job_id=JobId("j"), at=0.0, reason="x")),
        st.just(ev.JobCancelled(job_id=JobId("j"), at=0.0)),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(
    job_events,
    st.lists(st.floats(0.0, 100.0), min_size=25, max_size=25),
    st.lists(st.floats(0.0, 2000.0), min_size=25, max_size=25),
)
def test_record_invariants_under_any_event_order(
    events: list[ev.JobEvent], gaps: list[float], progress: list[float]
) -> None:
    rec = new_record(spec("j"), 0.0, seq=1)
    now, final_seen = 0.0, None
    for seq, (event, gap, p) in enumerate(zip(events, gaps, progress, strict=False), start=2):
        now += gap
        timed = msgspec.structs.replace(event, at=now)
        applied = apply_event(rec, timed, seq, facts_(p))
        assert apply_event(applied.record or rec, timed, seq, facts_(p)).record is None
        new = applied.record or rec
        assert new.wait_s >= rec.wait_s and new.attained_gpu_s >= rec.attained_gpu_s
        assert new.samples_done >= rec.samples_done and new.samples_done <= 1000.0
        assert set(rec.profiled) <= set(new.profiled) and new.last_seq == seq
        if final_seen is not None:
            assert new.phase == final_seen
        if new.final:
            final_seen = new.phase
        assert (new.phase == "running") == (new.configuration is not None)
        rec = new


# --- snapshots -------------------------------------------------------------------

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
B = GpuTypeSpec(GpuType("B"), 5e9, 1e9)


def node(sid: str, t: GpuTypeSpec, gpus: int, order: int, alive: bool = True) -> NodeRecord:
    return NodeRecord(
        server=Server(ServerId(sid), t.name, gpus), gpu_type=t, order=order, alive=alive
    )


NODES = [
    node("b0", B, 2, 2),
    node("a1", A, 4, 1),
    node("a0", A, 4, 0),
    node("dead", A, 8, 3, alive=False),
]


def live(job_id: str, phase: str, **kw: object) -> LiveJobRecord:
    submitted = float(kw.pop("submit", 0.0))  # type: ignore[arg-type]
    rec = new_record(msgspec.structs.replace(spec(job_id), submit_time=submitted), submitted)
    return msgspec.structs.replace(rec, phase=phase, **kw)


def alloc(job_id: str, mode: str = "run", **parts: int) -> Placement:
    return Placement(
        job_id=JobId(job_id),
        configuration=cfg(**parts),
        gpu_indices={},
        mode=mode,  # type: ignore[arg-type]
    )


def test_the_cluster_is_the_alive_nodes_in_order() -> None:
    cluster = cluster_of(NODES)
    assert [s.id for s in cluster.servers] == ["a0", "a1", "b0"]
    assert [t.name for t in cluster.gpu_types] == ["A", "B"] and cluster.total_gpus == 10
    assert topology(NODES) == (("a0", "A", 4, 0), ("a1", "A", 4, 1), ("b0", "B", 2, 2))
    beat = msgspec.structs.replace(NODES[0], last_heartbeat=99.0)
    assert topology([beat, *NODES[1:]]) == topology(NODES)
    f = facts(NODES, 3.0)
    assert f.required == BOTH and f.server_types[ServerId("dead")] == "A" and f.progress == 3.0


def test_snapshot_phases_and_held_gpus() -> None:
    records = {
        JobId("new"): live("new", "submitted", submit=1.0),
        JobId("half"): live("half", "profiling", profiled=(GpuType("A"),), submit=2.0),
        JobId("wait"): live("wait", "queued", since=10.0, wait_s=5.0, submit=3.0),
        JobId("run"): live(
            "run", "running", configuration=cfg(a1=2), since=90.0, attained_gpu_s=7.0
        ),
        JobId("lost"): live("lost", "running", configuration=cfg(dead=2)),
        JobId("done"): live("done", "finished"),
    }
    allocs = {
        JobId("run"): alloc("run", a1=2),
        JobId("new"): alloc("new", "profile", b0=1),
        JobId("done"): alloc("done", a0=1),  # not yet released
    }
    inflight = Inflight(grace_s=60.0)
    inflight.note_plan(
        Plan(profiling=(ProfilingTask(JobId("new"), GpuType("A"), ServerId("a0")),)),
        99.0,
        False,
        {},
    )
    ests = {JobId(j): flat_estimate(j, {"A": 100.0, "B": 200.0}) for j in ("wait", "run")}
    progress = {JobId("run"): 300.0}
    first = build_snapshot(100.0, records, NODES, allocs, ests, progress, inflight, True).snapshot
    by_id: dict[str, JobState] = {j.id: j for j in first.jobs}
    assert set(by_id) == {"new", "half", "wait", "run", "lost"}
    assert by_id["new"].phase == "profiling" and by_id["new"].unprofiled == ()  # both in flight
    assert by_id["half"].unprofiled == ("B",)
    assert (by_id["wait"].phase, by_id["wait"].wait_s) == ("queued", 95.0)
    assert by_id["run"].phase == "running" and by_id["run"].current == cfg(a1=2)
    assert by_id["run"].done_samples == 300.0 and by_id["run"].attained_gpu_s == 27.0
    assert by_id["lost"].phase == "queued" and by_id["lost"].current is None
    # First plan: profiling runs, the ended job's GPUs and unbooked tasks are held.
    assert first.held == {"a0": 2, "b0": 1} and set(first.estimates) == {"wait", "run"}
    fill = build_snapshot(100.0, records, NODES, allocs, ests, progress, inflight, False).snapshot
    assert fill.held == {"a0": 2, "a1": 2, "b0": 1}
    plan = HopsPolicy().plan(first)
    assert_feasible(plan, first)


def test_a_queued_job_waits_for_its_last_profiling_run_to_end() -> None:
    records = {JobId("q"): live("q", "queued", profiled=(GpuType("A"), GpuType("B")))}
    ests = {JobId("q"): flat_estimate("q", {"A": 100.0, "B": 100.0})}
    allocs = {JobId("q"): alloc("q", "profile", b0=1)}
    snap = build_snapshot(0.0, records, NODES, allocs, ests, {}, Inflight(60.0), True).snapshot
    assert [(j.phase, j.unprofiled) for j in snap.jobs] == [("profiling", ())]
    assert snap.held == {"b0": 1} and HopsPolicy().plan(snap).assignments == ()


def test_starts_in_flight_count_as_running_in_a_fill_plan() -> None:
    records = {JobId("w"): live("w", "queued", since=0.0)}
    inflight = Inflight(grace_s=60.0)
    inflight.note_plan(Plan(), 0.0, True, {})
    ests = {JobId("w"): flat_estimate("w", {"A": 100.0})}
    plan = HopsPolicy().plan(
        build_snapshot(1.0, records, NODES, {}, ests, {}, inflight, True).snapshot
    )
    assert [a.job_id for a in plan.assignments] == ["w"]
    inflight.note_plan(plan, 1.0, True, running_configs(records.values()))
    fill = build_snapshot(2.0, records, NODES, {}, ests, {}, inflight, False).snapshot
    config = plan.assignments[0].config
    assert fill.jobs[0].phase == "running" and fill.jobs[0].current == config
    assert fill.held == config.as_dict()
    assert HopsPolicy().plan(fill).assignments == ()
    # Booked by the placer, or started: no longer in flight.
    booked = {JobId("w"): Placement(job_id=JobId("w"), configuration=config, gpu_indices={})}
    inflight.settle(records, booked, 3.0)
    assert inflight.starts == {}


def test_a_running_job_without_an_estimate_keeps_its_gpus() -> None:
    records = {JobId("r"): live("r", "running", configuration=cfg(a0=4))}
    built = build_snapshot(0.0, records, NODES, {}, {}, {}, Inflight(60.0), True)
    assert built.snapshot.jobs == () and built.snapshot.held == {"a0": 4}
    assert built.sticky == {"r": cfg(a0=4)}
    plan = with_sticky(Plan(), built.sticky)
    assert plan.config_of(JobId("r")) == cfg(a0=4)
    assert with_sticky(plan, {}) is plan


def test_inflight_profiling_waits_until_profiled_or_expired() -> None:
    records = {JobId("j"): live("j", "profiling")}
    inflight = Inflight(grace_s=10.0)
    task = ProfilingTask(JobId("j"), GpuType("A"), ServerId("a0"))
    inflight.note_plan(Plan(profiling=(task,)), 0.0, False, {})
    booked = {JobId("j"): alloc("j", "profile", a0=1)}
    assert (
        inflight.unbooked_profiling({}) == {"a0": 1} and inflight.unbooked_profiling(booked) == {}
    )
    inflight.settle(records, booked, 8.0)  # still running: seen at 8
    inflight.settle(records, {}, 17.0)
    assert inflight.profiling_types(JobId("j")) == {"A"}
    inflight.settle(records, {}, 18.5)
    assert inflight.profiling == {}
    inflight.note_plan(Plan(profiling=(task,)), 20.0, False, {})
    profiled = {JobId("j"): live("j", "profiling", profiled=(GpuType("A"),))}
    inflight.settle(profiled, {}, 21.0)
    assert inflight.profiling == {}


live_jobs = st.lists(
    st.tuples(
        st.sampled_from(["submitted", "profiling", "queued", "running", "finished"]),
        st.sampled_from([(1,), (2,), (1, 2, 4), (4,), (8,)]),
        st.booleans(),  # has its placement in hops_alloc (a running job) or a stale one
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=40, deadline=None)
@given(live_jobs, st.booleans())
def test_plans_on_live_snapshots_never_double_book(
    jobs: list[tuple[str, tuple[int, ...], bool]], first: bool
) -> None:
    capacity = {"a0": 4, "a1": 4, "b0": 2}
    room = dict(capacity)
    records: dict[JobId, LiveJobRecord] = {}
    allocs: dict[JobId, Placement] = {}
    for i, (phase, reqs, booked) in enumerate(jobs):
        jid = JobId(f"j{i}")
        rec = msgspec.structs.replace(live(jid, phase, submit=float(i)), spec=spec(jid, reqs))
        if phase == "running":
            server = next((sid for sid, g in room.items() if g >= reqs[0]), None)
            if server is None:
                rec = msgspec.structs.replace(rec, phase="queued")
            else:
                room[server] -= reqs[0]
                config = cfg(**{server: reqs[0]})
                rec = msgspec.structs.replace(rec, configuration=config)
                if booked:
                    allocs[jid] = Placement(job_id=jid, configuration=config, gpu_indices={})
        records[jid] = rec
    ests = {j: flat_estimate(j, {"A": 100.0, "B": 150.0}) for j in records}
    built = build_snapshot(50.0, records, NODES, allocs, ests, {}, Inflight(60.0), first)
    snap = built.snapshot
    plan = make_policy("hops").plan(snap)  # with its profiling-first layer
    assert_feasible(plan, snap)
    running = {j for j, r in records.items() if r.phase == "running"}
    assigned = {a.job_id for a in plan.assignments}
    if not first:  # a plan within the round only adds, on GPUs nobody holds
        assert not assigned & running
        used = {s: capacity[s] - room[s] for s in capacity}
        assert snap.held == {s: g for s, g in used.items() if g}
    assert all(records[j].phase in ("queued", "running") for j in assigned)


def test_a_type_that_cannot_be_profiled_is_given_up_after_some_attempts() -> None:
    records = {JobId("j"): live("j", "profiling", profiled=(GpuType("A"),))}
    inflight = Inflight(grace_s=10.0, max_attempts=2)
    task = ProfilingTask(JobId("j"), GpuType("B"), ServerId("b0"))
    for attempt in range(2):
        assert inflight.given_up(JobId("j")) == set()
        inflight.note_plan(Plan(profiling=(task,)), 100.0 * attempt, False, {})
        inflight.settle(records, {}, 100.0 * attempt + 11.0)  # never booked: expired
    assert inflight.given_up(JobId("j")) == {"B"}
    snap = build_snapshot(300.0, records, NODES, {}, {}, {}, inflight, True).snapshot
    assert snap.jobs[0].unprofiled == () and make_policy("hops").plan(snap).profiling == ()
    required = facts(NODES, given_up=inflight.given_up(JobId("j"))).required
    promoted = promote(records[JobId("j")], required, 300.0)
    assert required == {"A"} and promoted is not None and promoted.phase == "queued"


def test_estimate_requests_are_chunked_and_need_servers() -> None:
    records = {JobId(f"j{i}"): live(f"j{i}", "queued") for i in range(5)}
    records[JobId("p")] = live("p", "profiling")
    records[JobId("f")] = live("f", "finished")
    cluster = cluster_of(NODES)
    reqs = estimate_requests(records, cluster, 2)
    # A job being profiled is asked about too: the reply names the types its
    # profile signature holds shared profiles of (scheduling.live.reuse).
    assert [len(r.jobs) for r in reqs] == [2, 2, 2] and reqs[0].cluster == cluster
    assert "f" not in {j.id for r in reqs for j in r.jobs}
    assert estimate_requests(records, cluster_of([]), 2) == []


def test_queue_view_follows_the_planner() -> None:
    records = {
        JobId(f"q{i}"): live(f"q{i}", "queued", since=0.0, wait_s=float(10 * i), submit=float(i))
        for i in range(6)
    }
    records[JobId("p")] = live("p", "profiling", submit=9.0)
    ests = {
        j: flat_estimate(j, {"A": 50.0 + i, "B": 80.0}) for i, j in enumerate(records) if j != "p"
    }
    snap = build_snapshot(100.0, records, NODES, {}, ests, {}, Inflight(60.0), True).snapshot
    plan = HopsPolicy().plan(snap)
    view = queue_view(plan.reasons, records, snap.now, "me", 7)
    assert (view.leader, view.term, view.ok) == ("me", 7, True)
    order = [e.job_id for e in view.entries]
    assert order[:6] == ["q5", "q4", "q3", "q2", "q1", "q0"] and order[6] == "p"
    assert view.entries[-1].phase == "profiling" and not view.entries[-1].in_window
    assert {e.job_id for e in view.entries if e.in_window} == set(plan.reasons.window)
    for e in view.entries[:6]:
        assert e.priority == pytest.approx(plan.reasons.priorities[e.job_id])
        assert e.latency_ratio == e.priority  # the LR priority is the latency ratio
    assert msgspec.json.decode(msgspec.json.encode(view), type=type(view)) == view


@pytest.mark.parametrize("policy", ["sia", "gavel"])
def test_queue_view_reads_any_policys_reasons_and_lists_late_jobs_unranked(policy: str) -> None:
    records = {
        JobId(f"q{i}"): live(f"q{i}", "queued", since=0.0, wait_s=float(10 * i), submit=float(i))
        for i in range(4)
    }
    ests = {j: flat_estimate(j, {"A": 50.0 + i, "B": 80.0}) for i, j in enumerate(records)}
    snap = build_snapshot(100.0, records, NODES, {}, ests, {}, Inflight(60.0), True).snapshot
    reasons = make_policy(policy).plan(snap).reasons
    assert reasons.policy == policy and set(reasons.latency_ratios) == set(records)
    records[JobId("late")] = live("late", "queued", submit=50.0)  # since the plan
    records[JobId("held")] = live("held", "queued", submit=51.0, reason="unschedulable: x")
    records[JobId("ran")] = live("ran", "running", submit=52.0)
    view = queue_view(reasons, records, snap.now, "me", 3)
    assert [e.job_id for e in view.entries] == ["q3", "q2", "q1", "q0", "late"]
    for e in view.entries[:4]:
        assert e.priority == reasons.priorities[e.job_id] > 0 and not e.in_window
        assert e.latency_ratio == reasons.latency_ratios[e.job_id]
    assert (view.entries[-1].priority, view.entries[-1].phase) == (0.0, "queued")
    assert view.at == 100.0


# --- round timing ------------------------------------------------------------------


def test_round_clock() -> None:
    clock = RoundClock(round_s=300.0, replan_delay_s=1.0, refresh_s=30.0, now=0.0, round_no=4)
    assert clock.due(0.0) == "first"
    clock.done("first", 0.0)
    assert clock.round == 5 and clock.due(1.0) is None and clock.sleep_s(1.0) == 29.0
    clock.request_replan(10.0)
    clock.request_replan(10.5)  # shares the first request's plan
    assert clock.due(10.9) is None and clock.due(11.0) == "fill" and clock.sleep_s(10.0) == 1.0
    clock.done("fill", 11.0)
    clock.request_replan(11.5)  # while the fill plan of 11.0 was being made
    clock.done("fill", 11.0)
    assert clock.due(12.4) is None and clock.due(12.5) == "fill"
    clock.done("fill", 12.5)
    assert clock.due(42.4) is None and clock.due(42.5) == "refresh"
    clock.done("refresh", 42.5)
    assert clock.due(300.0) == "first" and clock.sleep_s(400.0) == 0.0
    assert clock.replan_at is None
    with pytest.raises(ValueError):
        RoundClock(0.0, 1.0, 30.0, 0.0)


def test_a_request_made_while_a_plan_is_made_outlives_it() -> None:
    """A job that became plannable after a plan took its snapshot gets a
    plan of its own, also when an earlier request was pending then (that
    one the plan served)."""
    clock = RoundClock(round_s=3600.0, replan_delay_s=0.5, refresh_s=30.0, now=0.0)
    clock.done("first", 0.0)
    clock.request_replan(10.0)
    assert clock.due(10.5) == "fill"  # the plan's snapshot is taken at 10.5
    clock.request_replan(10.7)  # while that plan was being made
    clock.request_replan(10.9)
    clock.done("fill", 10.5)
    assert clock.due(11.3) is None and clock.due(11.4) == "fill"
    clock.done("fill", 11.4)
    assert clock.replan_at is None and clock.due(12.0) is None


@given(st.lists(st.tuples(st.floats(0.01, 5.0), st.sampled_from(["request", "begin", "end"])),
                min_size=1, max_size=30))
def test_no_replan_request_is_lost(steps: list[tuple[float, str]]) -> None:
    """Property: whatever the interleaving of requests and fill plans (a plan
    takes its snapshot when it begins and is done later), a replan is due
    exactly when some request came after the last done plan's snapshot."""
    clock = RoundClock(round_s=1e9, replan_delay_s=0.25, refresh_s=1e9, now=0.0)
    clock.done("first", 0.0)
    now, served, began, requests = 0.0, 0.0, None, [0.0]
    for gap, action in steps:
        now += gap
        if action == "request":
            clock.request_replan(now)
            requests.append(now)
        elif action == "begin" and began is None and clock.due(now) == "fill":
            began = now
        elif action == "end" and began is not None:
            clock.done("fill", began)
            served, began = began, None
    assert (clock.replan_at is not None) == any(r > served for r in requests)


# --- admission -------------------------------------------------------------------------


def test_admission_decisions() -> None:
    ok = spec("job-1_x=")
    assert adm.check_spec(ok) is None and adm.valid_id("job-1_x=")
    assert "may only contain" in str(adm.check_spec(msgspec.structs.replace(ok, id=JobId("a@b"))))
    assert "at most 128" in str(adm.check_spec(msgspec.structs.replace(ok, id=JobId("x" * 129))))
    assert "model" in str(adm.check_spec(msgspec.structs.replace(ok, model=" ")))
    huge = JobSpec(JobId("h"), "m", 1, 1, 1, min_gpus=1, max_gpus=5000)
    assert "5000 GPUs" in str(adm.check_spec(huge))
    assert not adm.valid_id("a b") and not adm.valid_id("")
    assert adm.accepted_spec(ok, 12.5).submit_time == 12.5
    record = new_record(ok, 0.0)
    assert adm.duplicate(ok.id, ok.tenant, None) is None
    assert adm.duplicate(ok.id, ok.tenant, record) == adm.Refusal(
        "conflict", "job job-1_x= exists already (phase submitted)"
    )
    # under the default's key, another tenant's record (one written before
    # keys were qualified) is named by neither tenant nor phase
    assert adm.duplicate(ok.id, "default", msgspec.structs.replace(
        record, spec=msgspec.structs.replace(ok, tenant=TenantId("bob")))) == adm.Refusal(
        "conflict", "job id job-1_x= is taken; choose another")
    assert adm.cancel_refusal(JobId("z"), None) == adm.Refusal("not_found", "no job z")
    assert adm.cancel_refusal(ok.id, record) is None
    finished = msgspec.structs.replace(record, phase="finished")
    assert adm.cancel_refusal(ok.id, finished) == adm.Refusal(
        "conflict", "job job-1_x= is finished already"
    )


def test_scheduler_settings_from_environment_and_flags() -> None:
    env = {"HOPS_ROUND_S": "30", "HOPS_REPLAN_DELAY_S": "0", "HOPS_REPLICA_ID": "s1"}
    s = scheduler_settings(env)
    assert (s.round_s, s.replan_delay_s, s.refresh_s, s.replica("h", 1)) == (30.0, 0.0, 30.0, "s1")
    s = scheduler_settings(env, {"round_s": 5.0, "replica_id": None})
    assert s.round_s == 5.0 and s.replica("h", 1) == "s1"
    assert SchedulerSettings().replica("host", 42) == "host-42"
    with pytest.raises(SettingsError, match=r"HOPS_ROUND_S must be >= 0\.001"):
        scheduler_settings({"HOPS_ROUND_S": "0"})
    with pytest.raises(SettingsError, match="HOPS_ESTIMATE_TIMEOUT_S must be a number"):
        scheduler_settings({"HOPS_ESTIMATE_TIMEOUT_S": "soon"})
    with pytest.raises(SettingsError, match=r"--round-s must be >= 0\.001, got '-1\.0'"):
        scheduler_settings({}, {"round_s": -1.0})


def test_progress_counts_only_from_the_subjects_server_and_a_server_of_the_placement() -> None:
    beat = ev.JobHeartbeat(job_id=JobId("j"), server_id=ServerId("a"), samples_done=5.0, at=1.0)
    placed = Configuration.of({"a": 1, "b": 1})
    assert counts_progress(beat, ("a", "j"), placed)
    assert counts_progress(beat, ("a", "j"), None)  # placement not known yet
    assert not counts_progress(beat, ("b", "j"), placed)  # the payload claims another server
    assert not counts_progress(beat, ("a", "k"), placed)  # another job's subject
    elsewhere = ev.JobHeartbeat(job_id=JobId("j"), server_id=ServerId("c"), samples_done=5.0,
                                at=1.0)
    assert not counts_progress(elsewhere, ("c", "j"), placed)  # not a server of the placement
