"""The pure core of the data plane, without NATS: the placer's plan diff and
GPU booking, the executor's ledger and emulator, the monitor's deadlines,
registration rules, release decisions and metrics."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from executor.emulator import (
    MAX_SAMPLE_ITERS,
    Cadence,
    EmulationError,
    Progress,
    check_runnable,
    profile_wall_s,
    role_of,
    run_progress,
    sample_iterations,
)
from executor.ledger import NodeLedger
from executor.supervisor import child_argv
from services.monitor.deadlines import DeadlineTracker
from services.monitor.metrics import LatencyBook, cluster_metrics, render
from services.monitor.nodes import Refusal, admit
from services.monitor.release import (
    EarlyReports,
    on_heartbeat_lost,
    on_job_end,
    on_node_lost,
    on_profiled,
    on_vanished,
)
from services.placer.booking import book, free_indices
from services.placer.commands import Want, command_key, plan_prefix
from services.placer.diff import changes, diff
from services.placer.gate import PlanGate
from shared import events as ev
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import JobRecord, NodeRecord, Placement, QueueEntry
from shared.resources import Resources
from shared.snapshot import Assignment, Plan, ProfilingTask
from world.catalog import builtin_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

A, B, C = ServerId("a"), ServerId("b"), ServerId("c")
CAP = {A: Resources(gpus=4), B: Resources(gpus=4)}


def spec(job: str) -> JobSpec:
    return JobSpec(JobId(job), "resnet18-cifar10", 32, 1000, 10**9, requirements=(1, 2, 4))


def record(job: str, phase: str = "queued") -> JobRecord:
    return JobRecord(spec=spec(job), submitted_at=0.0, phase=phase)  # type: ignore[arg-type]


def placement(job: str, idx: Mapping[str, tuple[int, ...]], mode: str = "run") -> Placement:
    config = Configuration.of({s: len(i) for s, i in idx.items()})
    return Placement(job_id=JobId(job), configuration=config,
                     gpu_indices={ServerId(s): i for s, i in idx.items()}, mode=mode)  # type: ignore[arg-type]


def assign(**jobs: dict[str, int]) -> tuple[Assignment, ...]:
    return tuple(Assignment(JobId(j), Configuration.of(c)) for j, c in jobs.items())


# --- the placer ----------------------------------------------------------------------


def test_a_first_plan_keeps_moves_stops_and_starts() -> None:
    current = {"keep": placement("keep", {A: (0,)}), "move": placement("move", {A: (1, 2)}),
               "gone": placement("gone", {B: (0, 1)}), "prof": placement("prof", {B: (2,)},
                                                                         "profile")}
    jobs = {j: record(j) for j in ("keep", "move", "gone", "prof", "new")}
    plan = Plan(assignments=assign(keep={A: 1}, move={B: 2}, new={A: 2}))
    cmds = diff(current, plan, True, jobs, CAP, "t1.r1.p1")
    assert [(s.job_id, s.resize, s.reason) for s in cmds.stops] == [
        ("move", True, "resize"), ("gone", False, "not in the plan")]
    starts = {s.job_id: s for s in cmds.starts}
    assert set(starts) == {"move", "new"} and starts["move"].resize
    # gone's and move's GPUs are free again; prof's profiling run is left alone
    assert starts["move"].placement.gpu_indices == {B: (0, 1)}
    assert starts["new"].placement.gpu_indices == {A: (1, 2)}
    assert cmds.problems == ()
    # a plan later in the round only adds
    fill = diff(current, Plan(assignments=assign(new={A: 1}, more={A: 2})), False,
                jobs | {"more": record("more")}, CAP, "p")
    assert fill.stops == () and [s.job_id for s in fill.starts] == ["new"]
    assert fill.starts[0].placement.gpu_indices == {A: (3,)}
    assert [(p.job_id, p.code) for p in fill.problems] == [("more", "conflict")]


def test_profiling_runs_share_a_placement_and_go_first() -> None:
    current = {"p": placement("p", {A: (0,)}, "profile")}
    jobs = {"p": record("p", "profiling"), "big": record("big")}
    plan = Plan(assignments=assign(big={B: 4}),
                profiling=(ProfilingTask(JobId("p"), GpuType("g"), A),
                           ProfilingTask(JobId("p"), GpuType("h"), B)))
    cmds = diff(current, plan, True, jobs, CAP, "x")
    # the profiling run on b books first, so the 4-GPU job no longer fits there
    assert [s.job_id for s in cmds.starts] == ["p"]
    (start,) = cmds.starts
    assert start.placement.configuration.as_dict() == {A: 1, B: 1}
    assert start.placement.gpu_indices == {A: (0,), B: (0,)} and start.placement.mode == "profile"
    assert [(lc.server, lc.configuration.as_dict()) for lc in start.launches] == [(B, {B: 1})]
    assert [(p.job_id, p.code) for p in cmds.problems] == [("big", "conflict")]


def test_what_the_placer_refuses() -> None:
    current = {"run": placement("run", {A: (0,)}), "prof": placement("prof", {B: (0,)},
                                                                     "profile")}
    jobs = {j: record(j) for j in ("run", "prof", "x")} | {"done": record("done", "finished")}
    plan = Plan(
        assignments=(*assign(x={A: 1}, done={A: 1}, ghost={A: 1}, prof={A: 1}, far={C: 1}),
                     Assignment(JobId("x"), Configuration.of({B: 1}))),
        profiling=(ProfilingTask(JobId("run"), GpuType("g"), B),),
    )
    jobs["far"] = record("far")
    ch = changes(current, plan, True, jobs)
    codes = sorted((p.job_id, p.code) for p in ch.problems)
    assert codes == [("done", "invalid"), ("ghost", "not_found"), ("prof", "conflict"),
                     ("run", "conflict"), ("x", "invalid")]
    # "run" is not assigned on a first plan: it is stopped; its profiling task refused
    assert [s.job_id for s in ch.stops] == ["run"]
    starts, problems = book(ch.wants, {}, CAP, "k")
    assert [s.job_id for s in starts] == ["x"]
    assert [(p.job_id, p.code) for p in problems] == [("far", "unknown_server")]


def test_keys_and_term_gate() -> None:
    prefix = plan_prefix(3, 7, 42)
    assert command_key("start", prefix, JobId("j"), A) == "start:t3.r7.p42:j@a"
    assert command_key("start", prefix, JobId("j"), B) != command_key("stop", prefix, JobId("j"),
                                                                        B)
    gate = PlanGate()
    admitted = []
    # (plan term, lease term, stream seq); None: no lease
    for term, lease, seq in ((1, 1, 1), (2, 2, 2), (1, 2, 3), (2, 2, 4), (2, 2, 4), (2, 2, 3),
                             (10**12, 3, 5), (3, 3, 6), (3, None, 7), (0, 3, 8)):
        refused = gate.refuse(term, lease, seq)
        if refused is None:
            admitted.append(seq)
            gate.applied(seq)
        else:  # only a term no leader held is an error record
            assert bool(refused.code) == (lease is not None and term > lease), refused
    # other terms than the lease's, repeats and late redeliveries are skipped; a forged
    # huge term leaves the gate as it was
    assert admitted == [1, 2, 4, 6]
    assert free_indices([placement("j", {A: (1, 3)})], {A: 4}) == {A: [0, 2]}
    assert book([Want(JobId("w"), Configuration.of({A: 2}), "run")], {}, {A: Resources(gpus=1)},
                "k")[1][0].code \
        == "conflict"


def test_a_plan_replaced_by_a_later_first_plan_of_its_leader_is_skipped() -> None:
    """A first plan replans every job: an older plan of the same term is
    skipped once one is on the stream (its starts would be stopped at once);
    a later fill plan, another term's plan, or no newest plan known skip
    nothing."""
    gate = PlanGate()
    assert gate.superseded(2, 10, (11, 2, True)) is not None
    assert "superseded by the first plan 11" in str(gate.superseded(2, 10, (11, 2, True)))
    assert gate.superseded(2, 10, (11, 2, False)) is None  # a fill plan adds to this one
    assert gate.superseded(2, 10, (11, 3, True)) is None  # another leader's: the term gate rules
    assert gate.superseded(2, 10, (10, 2, True)) is None  # itself
    assert gate.superseded(2, 10, None) is None


servers = st.sampled_from([A, B, C, ServerId("gone")])


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[JobId, Placement], Plan, dict[ServerId, int], bool]:
    capacity = {s: draw(st.integers(1, 6)) for s in (A, B, C)}
    current: dict[JobId, Placement] = {}
    free = {s: list(range(n)) for s, n in capacity.items()}
    for n in range(draw(st.integers(0, 5))):
        s = draw(st.sampled_from([A, B, C]))
        k = draw(st.integers(0, len(free[s])))
        if k:
            mode = draw(st.sampled_from(["run", "profile"]))
            current[JobId(f"j{n}")] = placement(f"j{n}", {s: tuple(free[s][:k])}, mode)
            free[s] = free[s][k:]
    jobs = [JobId(f"j{n}") for n in range(8)]
    assignments = tuple(
        Assignment(job, Configuration.of(draw(st.dictionaries(servers, st.integers(1, 4),
                                                              min_size=1, max_size=2))))
        for job in draw(st.lists(st.sampled_from(jobs), max_size=6)))
    profiling = tuple(ProfilingTask(job, GpuType("g"), draw(servers))
                      for job in draw(st.lists(st.sampled_from(jobs), max_size=3)))
    return current, Plan(assignments=assignments, profiling=profiling), capacity, draw(
        st.booleans())


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_gpu_is_ever_booked_twice(case: tuple[dict[JobId, Placement], Plan,
                                                 dict[ServerId, int], bool]) -> None:
    current, plan, capacity, first = case
    jobs = {JobId(f"j{n}"): record(f"j{n}") for n in range(8)}
    cmds = diff(current, plan, first, jobs, {s: Resources(gpus=n) for s, n in capacity.items()},
                "p")
    stopped = {s.job_id for s in cmds.stops}
    assert stopped <= set(current)
    after = {j: p for j, p in current.items() if j not in stopped}
    for start in cmds.starts:
        assert start.job_id not in after or start.placement.mode == "profile"
        after[start.job_id] = start.placement
    booked: set[tuple[ServerId, int]] = set()
    for p in after.values():
        assert {s: len(i) for s, i in p.gpu_indices.items()} == p.configuration.as_dict()
        for s, idx in p.gpu_indices.items():
            for i in idx:
                assert (s, i) not in booked
                booked.add((s, i))
    for start in cmds.starts:
        for launch in start.launches:
            assert all(0 <= i < capacity[launch.server] for i in launch.gpu_indices)
            assert len(launch.gpu_indices) == launch.configuration.as_dict()[launch.server]
    if not first:
        assert all(s.resize for s in cmds.stops)


# --- the executor --------------------------------------------------------------------


SERVER = Server(ServerId("s"), GpuType("RTX3090"), 4)


def start_cmd(key: str, job: str, idx: tuple[int, ...], server: str = "s") -> ev.StartJob:
    return ev.StartJob(key=key, job_id=JobId(job), server_id=ServerId(server), spec=spec(job),
                       configuration=Configuration.of({server: len(idx)}), gpu_indices=idx)


def test_the_ledger_answers_each_key_once_and_never_double_books() -> None:
    ledger = NodeLedger(SERVER, max_keys=3)
    cmd = start_cmd("k1", "j1", (0, 1))
    assert ledger.refuse_start(cmd) is None
    ledger.book(cmd)
    ack = ledger.remember(ev.CommandAck(key="k1", ok=True))
    assert ledger.answered("k1") == ack
    assert ledger.refuse_start(start_cmd("k2", "j1", (2,))).code == "conflict"  # type: ignore[union-attr]
    busy = ledger.refuse_start(start_cmd("k3", "j2", (1, 2)))
    assert busy is not None and busy.code == "conflict" and "j1" in busy.error
    assert ledger.refuse_start(start_cmd("k4", "j2", (4,))).code == "invalid"  # type: ignore[union-attr]
    assert ledger.refuse_start(start_cmd("k5", "j2", (0,), "t")).code == "invalid"  # type: ignore[union-attr]
    stop = ev.StopJob(key="s1", job_id=JobId("nope"))
    assert ledger.refuse_stop(stop).code == "not_found"  # type: ignore[union-attr]
    assert ledger.running() == ("j1",) and ledger.in_use() == {0, 1}
    ledger.ending(JobId("j1"))  # its report is out, it exits: not listed, GPUs still held
    assert ledger.running() == () and ledger.in_use() == {0, 1}
    ledger.release(JobId("j1"))
    assert ledger.refuse_start(start_cmd("k3", "j2", (1, 2))) is None
    for k in ("a", "b", "c"):
        ledger.remember(ev.CommandAck(key=k, ok=True))
    assert ledger.answered("k1") is None  # the oldest keys age out


TRUTH = GroundTruth(builtin_cluster("paper-physical"), builtin_catalog())
RTX = ServerId("rtx3090-sugon-0")


def test_the_emulator_runs_at_the_ground_truth_rate() -> None:
    config = Configuration.of({RTX: 2})
    run = run_progress(TRUTH, spec("j"), config, samples_done=500.0, time_scale=60.0)
    assert run.rate == pytest.approx(TRUTH.throughput("resnet18-cifar10", config) * 60.0)
    assert run.at(0.0) == 500.0 and run.at(-1.0) == 500.0
    assert run.at(1.0) == pytest.approx(500.0 + run.rate)
    done_at = run.remaining_s(0.0)
    assert run.done(done_at) and not run.done(done_at * 0.99) and run.at(1e9) == run.total
    assert run.remaining_s(done_at + 1) == 0.0
    assert Progress(0.0, 0.0, 10.0).remaining_s(0.0) == math.inf
    with pytest.raises(EmulationError, match="unknown model"):
        check_runnable(TRUTH, "no-such-net", RTX)
    with pytest.raises(EmulationError, match="not in the emulated cluster"):
        check_runnable(TRUTH, "resnet18-cifar10", ServerId("elsewhere"))
    with pytest.raises(EmulationError, match="does not run"):
        check_runnable(TRUTH, "gavel:A3C", RTX)
    assert profile_wall_s(30.0, 60.0) == 0.5
    assert sample_iterations(0.0, 32, 2) == 1
    assert sample_iterations(64.0 * 10, 32, 2) == 10
    assert sample_iterations(1e12, 32, 2) == MAX_SAMPLE_ITERS


def test_roles_and_cadence() -> None:
    config = Configuration.of({A: 1, B: 2})
    assert [role_of("run", config, s) for s in (A, B)] == ["lead", "worker"]
    assert role_of("profile", Configuration.of({B: 1}), B) == "profile"
    beat = Cadence(1.0)
    assert [beat.due(t) for t in (0.0, 0.5, 1.0, 1.2, 3.5, 3.6)] == [
        True, False, True, False, True, False]
    argv = ["--cluster", "c", "--all", "--health-port", "9", "--time-scale=5", "--order", "2"]
    assert child_argv(argv, "s1", 4) == ["--cluster", "c", "--time-scale=5", "--server-id",
                                         "s1", "--order", "4"]


# --- the monitor ---------------------------------------------------------------------


def test_deadlines_blame_the_node_before_the_job() -> None:
    t = DeadlineTracker(timeout=3.0)
    t.watch_node(A, 0.0)
    t.watch_node(B, 0.0)
    t.expect(JobId("j"), [A, B], 0.0)
    assert not t.check(2.0)
    t.job_beat(JobId("j"), A, 2.0, 10.0)
    t.job_beat(JobId("j"), B, 2.0, 12.0)
    t.node_beat(A, 2.5)
    t.node_beat(B, 2.5)
    # b dies with its job: the job's deadline passes first, but b is silent too
    t.node_beat(A, 5.0)
    t.job_beat(JobId("j"), A, 5.0, 20.0)
    assert not t.check(5.4)
    found = t.check(5.6)
    assert found.nodes == ((B, 2.5),) and found.jobs == () and found.stranded == ()
    assert t.progress(JobId("j")) == 20.0 and t.expected(JobId("j")) == (A, B)
    t.release(JobId("j"))
    assert t.progress(JobId("j")) is None and not t.node_beat(B, 6.0)  # lost: not watched


def test_a_silent_job_hangs_or_ended_by_what_its_node_lists() -> None:
    t = DeadlineTracker(timeout=3.0, vanish_grace=10.0)
    t.watch_node(A, 0.0)
    t.expect(JobId("hung"), [A], 0.0)
    t.expect(JobId("ended"), [A], 0.0)
    t.job_beat(JobId("hung"), A, 0.4, 5.0)
    t.job_beat(JobId("ended"), A, 0.5, 7.0)
    for now in (1.0, 2.0, 3.0):
        t.node_beat(A, now, ["hung"])
    assert not t.check(3.1)  # the node has not beaten past the jobs' deadlines yet
    t.node_beat(A, 3.6, ["hung"])
    found = t.check(3.6)
    assert found.jobs == ((JobId("hung"), A),) and not found.vanished
    for now in (5.0, 7.0, 9.0):
        t.node_beat(A, now, [])
    assert not t.check(10.4)  # "ended" waits for the event of its end
    t.node_beat(A, 10.6, [])
    found = t.check(10.6)
    assert found.vanished == ((JobId("ended"), A),) and found.progress == {JobId("ended"): 7.0}
    assert not t.check(20.0).jobs and not t.expected(JobId("ended"))  # reported once
    t.expect(JobId("k"), [C], 4.0)  # a server never watched
    assert t.check(7.5).stranded == ((JobId("k"), C),)


def test_a_deaf_monitor_rebases_every_deadline() -> None:
    t = DeadlineTracker(timeout=3.0)
    t.watch_node(A, 0.0)
    t.expect(JobId("j"), [A], 0.0)
    t.job_beat(JobId("j"), A, 0.0, 1.0)
    t.rebase(10.0)  # nothing was heard from 0 to 10: the monitor's own outage
    assert not t.check(12.0)
    t.node_beat(A, 13.05, ["j"])  # the node beats past the job's new deadline (13.0)
    assert t.check(13.1).jobs == ((JobId("j"), A),)
    assert t.check(16.1).nodes == ((A, 13.05),)


def test_a_job_still_starting_is_not_lost_before_its_start_grace() -> None:
    # Placed at 0; its start came late (the placer held up by an election), so
    # its node lists it first at 5.0, before its process has beaten.
    t = DeadlineTracker(timeout=3.0, start_grace=10.0)
    t.watch_node(A, 0.0)
    t.expect(JobId("slow"), [A], 0.0)
    t.expect(JobId("stuck"), [A], 0.0)
    for now in (1.0, 2.0, 3.0, 4.0):
        t.node_beat(A, now, [])
    for now in (5.0, 6.0, 7.0, 8.0):
        t.node_beat(A, now, ["slow", "stuck"])
        assert not t.check(now).jobs
    t.job_beat(JobId("slow"), A, 8.5, 0.0)  # its first heartbeat: from now on, the timeout
    for now in (9.0, 11.0, 13.0, 15.0):
        t.node_beat(A, now, ["slow", "stuck"])
        t.job_beat(JobId("slow"), A, now, 0.0)
        assert not t.check(now).jobs
    t.node_beat(A, 15.2, ["slow", "stuck"])
    assert t.check(15.2).jobs == ((JobId("stuck"), A),)  # 10 s after its node first listed it
    t.node_beat(A, 18.2, ["slow"])
    assert t.check(18.2).jobs == ((JobId("slow"), A),)  # silent since 15: past the timeout


def test_orphans_are_reported_after_a_grace_and_again() -> None:
    t = DeadlineTracker(timeout=1.0)  # grace 2 s
    t.watch_node(A, 0.0)
    t.expect(JobId("placed"), [A], 0.0)
    t.node_beat(A, 0.5, ["placed", "stray"])
    t.job_beat(JobId("placed"), A, 0.5, 1.0)
    assert not t.check(1.0).orphans
    t.node_beat(A, 2.6, ["placed", "stray"])
    t.job_beat(JobId("placed"), A, 2.6, 1.0)
    assert t.check(2.6).orphans == ((JobId("stray"), A),)
    t.node_beat(A, 3.0, ["placed", "stray"])
    assert not t.check(3.0).orphans
    t.node_beat(A, 4.7, ["placed"])  # gone by itself
    assert not t.check(4.7).orphans


GT = GpuTypeSpec(GpuType("RTX3090"), 2.5e9, 1e9)


def test_registration_rules() -> None:
    req = ev.RegisterNode(server=SERVER, gpu_type=GT, order=2)
    rec = admit({}, req, 10.0)
    assert (rec.alive, rec.order, rec.registered_at, rec.last_heartbeat) == (True, 2, 10.0, 10.0)
    again = admit({SERVER.id: rec}, req, 20.0)
    assert again.registered_at == 10.0 and again.last_heartbeat == 20.0
    bigger = ev.RegisterNode(server=Server(SERVER.id, GpuType("RTX3090"), 8), gpu_type=GT)
    with pytest.raises(Refusal, match="gpus") as e:
        admit({SERVER.id: rec}, bigger, 20.0)
    assert e.value.code == "conflict"
    other = ev.RegisterNode(server=Server(ServerId("t"), GpuType("RTX3090"), 4),
                            gpu_type=GpuTypeSpec(GpuType("RTX3090"), 1e9, 1e9))
    with pytest.raises(Refusal, match="registered by s"):
        admit({SERVER.id: rec}, other, 20.0)


def test_release_decisions() -> None:
    run = placement("j", {A: (0,), B: (1, 2)})
    prof = placement("p", {A: (3,), B: (0,)}, "profile")
    end = on_job_end(run, "finished")
    assert (end.stop_on, end.event, end.reason) == ((A, B), "none", "finished")
    assert on_heartbeat_lost(run, ended=False).event == "failed"
    assert on_heartbeat_lost(run, ended=True).event == "none"
    lost = on_node_lost(B, run, 99.0)
    assert lost is not None and (lost.stop_on, lost.event, lost.samples_done) == (
        (A,), "stopped", 99.0)
    assert on_node_lost(C, run) is None
    assert on_node_lost(A, prof, 5.0).event == "none"  # type: ignore[union-attr]
    shrink = on_profiled(prof, A)
    assert shrink is not None and shrink.remaining is not None
    assert shrink.remaining.gpu_indices == {B: (0,)} and shrink.servers == (A,)
    last = on_profiled(placement("p", {B: (0,)}, "profile"), B)
    assert last is not None and last.remaining is None
    assert on_profiled(run, A) is None
    gone = on_vanished(run, B, 7.0)
    assert gone is not None and (gone.stop_on, gone.event, gone.samples_done) == (
        (A, B), "stopped", 7.0)
    assert on_vanished(run, B, 7.0, ended=True).event == "none"  # type: ignore[union-attr]
    part = on_vanished(prof, B, None)
    assert part is not None and part.remaining is not None and part.servers == (B,)
    early = EarlyReports(ttl=10.0)
    early.add(JobId("p"), B, 0.0)
    early.add(JobId("p"), C, 0.0)
    assert early.take(run, 1.0) == ()  # not a profiling placement
    assert early.take(prof, 1.0) == (B,) and early.take(prof, 1.0) == ()  # taken once
    early.add(JobId("p"), A, 0.0)
    assert early.take(prof, 11.0) == ()  # too old: forgotten


def node(sid: str, gpus: int, alive: bool = True) -> NodeRecord:
    return NodeRecord(server=Server(ServerId(sid), GpuType("RTX3090"), gpus), gpu_type=GT,
                      alive=alive)


def test_metrics_and_their_text() -> None:
    book = LatencyBook()
    book.observe([QueueEntry(job_id=JobId("f1"), priority=1.0, latency_ratio=0.5,
                             in_window=True),
                  QueueEntry(job_id=JobId("f2"), priority=1.0, latency_ratio=1.5,
                             in_window=True)])
    book.ended(JobId("f1"), 1000.0, "finished")
    book.ended(JobId("f1"), 1000.0, "finished")  # delivered twice
    book.ended(JobId("f2"), 5000.0, "finished")
    book.ended(JobId("x"), 5000.0, "failed")
    nodes = {ServerId("a"): node("a", 4), ServerId("b"): node("b", 8, alive=False)}
    allocs = {JobId("r"): placement("r", {A: (0, 1)}),
              JobId("p"): placement("p", {A: (2,)}, "profile")}
    jobs = {JobId("q"): record("q"), JobId("r"): record("r", "running")}
    text = render(cluster_metrics(nodes, allocs, jobs, book, {"placer": 2}, 5000.0 + 60, 1.0))
    m = {s.name + "".join(f"[{v}]" for v in s.labels.values()): s.value
         for f in text_string_to_metric_families(text) for s in f.samples}
    assert (m["hops_gpus_alive"], m["hops_gpus_used"], m["hops_gpu_utilisation"]) == (4, 3, 0.75)
    assert m["hops_fragmented_gpus"] == 1 and m["hops_queue_length"] == 1
    assert (m["hops_running_jobs"], m["hops_profiling_runs"]) == (1, 1)
    assert m["hops_nodes[alive]"] == 1 and m["hops_nodes[lost]"] == 1
    assert m["hops_jobs[queued]"] == 1 and m["hops_jobs[cancelled]"] == 0
    assert (m["hops_latency_ratio_max"], m["hops_latency_ratio_mean"]) == (1.5, 1.0)
    assert m["hops_raqlr"] == 1.5  # only f2 finished within the hour (Eq. 7)
    assert m["hops_jobs_finished_total[finished]"] == 2 and m["hops_errors_total[placer]"] == 2
    assert (m["hops_jobs_finished_total[failed]"], m["hops_jobs_finished_total[cancelled]"]) == (
        1, 0)
    assert m["hops_gpus_booked_ratio[RTX3090]"] == 0.75  # the lost node's GPUs not counted
    empty = render(cluster_metrics({}, {}, {}, LatencyBook(), {}, 0.0, 1.0))
    assert "hops_gpu_utilisation 0" in empty and list(text_string_to_metric_families(empty))
