"""CPU jobs (CODA) in the live scheduler.

Pure, no NATS: a CPU job is ``queued`` from its submission and never goes to
profiling nor to the estimators; the snapshot carries it (held under a
policy that does not schedule cores); running jobs carry the throughput
their heartbeats measured since their configuration took effect
(:mod:`scheduling.live.samples`); a plan's ``wake_after_s`` gets a fill plan
that much later (:class:`scheduling.live.clock.RoundClock`).

Live, with nats-server, every service and an EMULATED cluster whose servers
declare cores, under the GPU-only policy ``hops`` with the test layer that
gives every run 2 cores per GPU (tests/cores_layer.py): a CPU job submitted
through the gateway is refused 422 with the reason and changes nothing,
and ``hops nodes --json`` shows the cores a running job holds, used and
free per server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from typer.testing import CliRunner

from cli.main import app
from scheduling.live import refresh as rf
from scheduling.live.clock import MIN_WAKE_S, Inflight, RoundClock
from scheduling.live.samples import MAX_RESTART_S, Beat, Throughputs, in_place, rate
from scheduling.live.snapshot import build_snapshot, estimate_targets
from scheduling.live.state import LiveJobRecord, new_record
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord, Placement
from shared.resources import Resources
from shared.snapshot import Assignment, Plan
from tests.helpers import catalog_spec, flat_estimate
from tests.livestack import LiveStack, until

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
NODES = [NodeRecord(server=Server(ServerId(f"a{i}"), A.name, 4, cores=16), gpu_type=A, order=i)
         for i in range(2)]
A0 = ServerId("a0")


def cpu_spec(job_id: str = "c1", cores: int = 4) -> JobSpec:
    return JobSpec(id=JobId(job_id), model="etl", batch_size=1, params=1, total_samples=1000,
                   kind="cpu", cores=cores)


def gpu_spec(job_id: str = "g1") -> JobSpec:
    return JobSpec(id=JobId(job_id), model="m", batch_size=8, params=10, total_samples=1000,
                   requirements=(1,))


def running(rec: LiveJobRecord, config: Configuration, since: float) -> LiveJobRecord:
    return msgspec.structs.replace(rec, phase="running", configuration=config, since=since)


# --- a CPU job has nothing to profile ---------------------------------------------------


def test_a_cpu_job_is_queued_at_once_and_never_sent_to_profiling() -> None:
    rec = new_record(cpu_spec(), 10.0, seq=1)
    assert (rec.phase, rec.since) == ("queued", 10.0)
    assert new_record(gpu_spec(), 10.0).phase == "submitted"
    seen = rf.Cluster(NODES, frozenset({A.name}), frozenset(), 8, schedules_cores=True)
    for step in rf.steps(rec, seen, rf.InFlight(False, False, None), 20.0):
        rec = step(rec) or rec
    assert rec.phase == "queued" and rec.reason == ""
    # under a GPU-only policy it is held, with the reason
    held = rf.Cluster(NODES, frozenset({A.name}), frozenset(), 8, schedules_cores=False)
    for step in rf.steps(rec, held, rf.InFlight(False, False, None), 20.0):
        rec = step(rec) or rec
    assert rec.phase == "queued" and rec.reason.startswith("unschedulable: it is a CPU job")


def test_the_snapshot_carries_cpu_jobs_queued_without_estimates() -> None:
    records = {r.job_id: r for r in (new_record(cpu_spec(), 0.0), new_record(gpu_spec(), 0.0))}
    # A GPU job still submitted is asked for too (the reply names its
    # signature's shared profiles, scheduling.live.reuse); a CPU job never is.
    assert [s.id for s in estimate_targets(records)] == ["g1"]
    snap = build_snapshot(5.0, records, NODES, {}, {}, {}, Inflight(60.0), True).snapshot
    phases = {j.id: (j.phase, j.unprofiled) for j in snap.jobs}
    assert phases == {"c1": ("queued", ()), "g1": ("profiling", (A.name,))}
    assert next(j for j in snap.jobs if j.id == "c1").wait_s == 5.0
    queued = {k: msgspec.structs.replace(r, phase="queued") for k, r in records.items()}
    assert [s.id for s in estimate_targets(queued)] == ["g1"]  # no GPU estimate for a CPU job
    # A policy that does not schedule cores never sees it.
    held = build_snapshot(5.0, records, NODES, {}, {}, {}, Inflight(60.0), True,
                          schedules_cores=False).snapshot
    assert [j.id for j in held.jobs] == ["g1"]


def test_the_bandwidth_nodes_report_reaches_the_snapshot() -> None:
    from services.monitor.nodes import lost, revived

    beating = revived(NODES[0], 7.0, 42.5)
    assert beating.memory_bandwidth_gbps == 42.5
    assert revived(beating, 8.0).memory_bandwidth_gbps == 42.5  # a beat without a measure
    down = lost(msgspec.structs.replace(NODES[1], memory_bandwidth_gbps=9.0), 3.0)
    records = {r.job_id: r for r in (new_record(cpu_spec(), 0.0),)}
    snap = build_snapshot(10.0, records, [beating, down, *NODES[2:]], {}, {}, {},
                          Inflight(60.0), True).snapshot
    assert snap.bandwidth_gbps == {A0: 42.5}  # alive and measured only


def test_a_running_cpu_job_is_planned_without_an_estimate_and_kept_by_a_gpu_policy() -> None:
    config = Configuration.cpu(A0, 4)
    rec = running(new_record(cpu_spec(), 0.0), config, 10.0)
    alloc = Placement(job_id=rec.job_id, configuration=config, gpu_indices={A0: ()})
    built = build_snapshot(20.0, {rec.job_id: rec}, NODES, {rec.job_id: alloc}, {}, {},
                           Inflight(60.0), True)
    (job,) = built.snapshot.jobs
    assert (job.phase, job.current, built.sticky) == ("running", config, {})
    kept = build_snapshot(20.0, {rec.job_id: rec}, NODES, {rec.job_id: alloc}, {}, {},
                          Inflight(60.0), True, schedules_cores=False)
    assert kept.snapshot.jobs == () and kept.sticky == {rec.job_id: config}
    assert kept.snapshot.held_extras == {A0: Resources(cores=4)}


def test_a_record_follows_its_placements_cores_changed_in_place() -> None:
    gpus = Configuration.of({"a0": 2})
    rec = running(new_record(gpu_spec(), 0.0), gpus.with_extras({A0: Resources(cores=4)}), 10.0)
    retuned = gpus.with_extras({A0: Resources(cores=6)})
    seen = rf.Cluster(NODES, frozenset({A.name}), frozenset(), 8, schedules_cores=True)
    after = rec
    for step in rf.steps(rec, seen, rf.InFlight(False, True, None, retuned), 20.0):
        after = step(after) or after
    assert (after.configuration, after.restarts, after.since) == (retuned, rec.restarts, 10.0)
    moved = Configuration.of({"a1": 2})  # another placement: job_resized says so, not this
    for config in (moved, None, rec.configuration):
        for step in rf.steps(rec, seen, rf.InFlight(False, True, None, config), 20.0):
            assert step(rec) is None


# --- measured throughput -------------------------------------------------------------


def test_the_window_averages_the_heartbeats_since_the_configuration() -> None:
    assert rate([]) == 0.0 and rate([Beat(1.0, 10.0)]) == 0.0
    assert rate([Beat(1.0, 10.0), Beat(1.0, 20.0)]) == 0.0  # no time between
    assert rate([Beat(1.0, 10.0), Beat(3.0, 5.0)]) == 0.0  # went back
    t = Throughputs()
    job = JobId("g1")
    for at, done in [(8.0, 0.0), (9.0, 50.0), (10.0, 100.0), (11.0, 300.0), (13.0, 700.0)]:
        t.note(job, at, done)
    t.note(job, 12.0, 9999.0)  # older than the last kept: left out
    # Started at 10: the beats of 10, 11 and 13 count, 600 samples in 3 s.
    assert t.measured(job, 10.0) == (200.0, 10.0)
    assert t.measured(job, 13.0) == (0.0, 13.0)  # one beat since: nothing measured yet
    assert t.measured(JobId("other"), 5.0) == (0.0, 5.0)
    # A plan changed its cores in place at 11: only the beats since count.
    t.changed(job, 11.0)
    assert t.measured(job, 10.0) == (200.0, 11.0)
    assert t.measured(job, 12.5) == (0.0, 12.5)  # a restart after the change wins
    t.keep([])
    assert t.measured(job, 10.0) == (0.0, 10.0)


def test_the_window_keeps_the_last_beats() -> None:
    t = Throughputs(max_beats=3)
    for at in range(10):
        t.note(JobId("j"), float(at), float(at * at))
    assert t.measured(JobId("j"), 0.0) == ((81.0 - 49.0) / 2.0, 0.0)  # beats 7, 8, 9


def test_in_place_changes_keep_the_gpus() -> None:
    gpus = Configuration.of({"a0": 2})
    more = gpus.with_extras({A0: Resources(cores=6)})
    moved = Configuration.of({"a1": 2})
    plan = Plan(assignments=(Assignment(JobId("x"), more), Assignment(JobId("y"), moved),
                             Assignment(JobId("z"), gpus)))
    current = {JobId("x"): gpus.with_extras({A0: Resources(cores=4)}), JobId("y"): gpus,
               JobId("z"): gpus}
    assert in_place(plan, current) == (JobId("x"),)


def test_the_snapshot_carries_each_running_jobs_throughput() -> None:
    config = Configuration.of({"a0": 1})
    rec = running(new_record(gpu_spec(), 0.0), config, 100.0)
    t = Throughputs()
    for at, done in [(99.0, 10.0), (101.0, 20.0), (103.0, 60.0)]:
        t.note(rec.job_id, at, done)
    ests = {rec.job_id: flat_estimate("g1", {"A": 10.0})}
    snap = build_snapshot(104.0, {rec.job_id: rec}, NODES, {}, ests, {}, Inflight(60.0), True,
                          throughputs=t).snapshot
    (job,) = snap.jobs
    assert (job.phase, job.throughput, job.throughput_since) == ("running", 20.0, 100.0)
    queued = msgspec.structs.replace(rec, phase="queued", configuration=None)
    snap = build_snapshot(104.0, {rec.job_id: queued}, NODES, {}, ests, {}, Inflight(60.0),
                          True, throughputs=t).snapshot
    assert (snap.jobs[0].throughput, snap.jobs[0].throughput_since) == (0.0, 0.0)


def test_a_start_is_measured_until_its_progress_shows_and_the_snapshot_carries_it() -> None:
    t = Throughputs()
    job = JobId("g1")
    # Started at 100; beats at the resumed count until the checkpoint is
    # loaded, progress from 140: the restart cost 40 s.
    for at, done in [(101.0, 500.0), (120.0, 500.0), (140.0, 520.0), (141.0, 540.0)]:
        t.note(job, at, done)
    assert t.restart_s(job) == 0.0  # nothing measured before the snapshot asks
    t.measured(job, 100.0)
    assert t.restart_s(job) == 40.0
    # A second start at 200 that shows progress 20 s later: the mean of both.
    for at, done in [(201.0, 600.0), (220.0, 610.0)]:
        t.note(job, at, done)
    t.measured(job, 200.0)
    assert t.restart_s(job) == 30.0
    t.keep([])  # not running any more: the cost is remembered for its next start
    assert t.restart_s(job) == 30.0
    rec = msgspec.structs.replace(running(new_record(gpu_spec(), 0.0), Configuration.of(
        {"a0": 1}), 200.0), phase="queued", configuration=None)
    ests = {rec.job_id: flat_estimate("g1", {"A": 10.0})}
    snap = build_snapshot(230.0, {rec.job_id: rec}, NODES, {}, ests, {}, Inflight(60.0), True,
                          throughputs=t).snapshot
    assert snap.jobs[0].restart_s == 30.0


def test_a_restart_measured_on_a_skewed_clock_is_bounded() -> None:
    t = Throughputs()
    job = JobId("skewed")
    # The job's clock runs ten hours ahead of the placer's: its first
    # progress seems 36,000 s after the start. Recorded as two rounds.
    for at, done in [(36_000.0, 0.0), (36_010.0, 10.0)]:
        t.note(job, at, done)
    t.measured(job, 0.0)
    assert t.restart_s(job) == MAX_RESTART_S == 600.0


# --- wake-ups -------------------------------------------------------------------------


def test_a_plan_asking_to_wake_gets_a_fill_plan_that_much_later() -> None:
    clock = RoundClock(round_s=300.0, replan_delay_s=1.0, refresh_s=30.0, now=0.0)
    assert clock.due(0.0) == "first"
    clock.done("first", 0.0)
    clock.wake_in(0.0, 5.0)  # the first plan asked for another within 5 s
    assert clock.due(4.9) is None and clock.sleep_s(1.0) == 4.0
    assert clock.due(5.0) == "fill"  # a fill plan, not a round's first
    clock.done("fill", 5.0)
    clock.wake_in(5.0, 2.0)  # that plan asks again
    assert clock.wake_at == 7.0 and clock.due(6.0) is None and clock.due(7.0) == "fill"
    clock.done("fill", 7.0)
    clock.wake_in(7.0, 0.0)  # no need any more
    assert clock.wake_at is None and clock.due(36.0) is None and clock.sleep_s(7.0) == 30.0


def test_a_later_plan_replaces_the_wake_up_and_a_served_one_is_cleared() -> None:
    clock = RoundClock(round_s=300.0, replan_delay_s=1.0, refresh_s=30.0, now=0.0)
    clock.done("first", 0.0)
    clock.wake_in(0.0, 20.0)
    clock.request_replan(3.0)  # a release: its fill plan comes first
    assert clock.due(4.0) == "fill"
    clock.done("fill", 4.0)
    assert clock.wake_at == 20.0  # not served by that plan: still due
    clock.wake_in(4.0, 2.0)  # ... but that plan asked for sooner
    assert clock.wake_at == 6.0
    clock.done("fill", 6.0)  # a plan that failed: the wake is served, not retried in a loop
    assert clock.wake_at is None
    clock.wake_in(6.0, 0.001)  # a tiny wake-up is floored
    assert clock.wake_at == pytest.approx(6.0 + MIN_WAKE_S)
    clock.done("refresh", 6.5)  # a refresh serves no wake-up
    assert clock.wake_at is not None
    assert clock.due(300.0) == "first"  # a round's start comes first


# --- live -------------------------------------------------------------------------------

CLUSTER = """\
name: cores
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4, cores: 16}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4, cores: 24}
"""
LONG = 10_000_000_000  # runs for the whole test


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LiveStack]:
    with LiveStack(tmp_path, CLUSTER, schedulers=1, env={"HOPS_TEST_CORES_PER_GPU": "2"},
                   modules={"scheduler": "tests.cores_layer"}) as s:
        yield s


def nodes_json(stack: LiveStack) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["nodes", "--json", "--gateway", stack.config.gateway_url,
                                      "--token", stack.admin_token])
    assert result.exit_code == 0, result.output
    body: dict[str, Any] = json.loads(result.output)
    return body


def test_a_cpu_job_under_a_gpu_policy_is_refused_and_nodes_show_cores(stack: LiveStack) -> None:
    bus = stack.bus_()
    job = {"id": "etl-1", "model": "etl", "batch_size": 1, "params": 1, "total_samples": 1000,
           "kind": "cpu", "cores": 4}
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as gw:
        answer = gw.post("/jobs", json=job)
        assert answer.status_code == 422, answer.text
        assert answer.json()["code"] == "unschedulable", answer.json()
        assert "policy hops does not schedule CPU cores; run coda, fifo, drf or fixed-cores" \
            in answer.json()["error"]
        bad = gw.post("/jobs", json={**job, "id": "etl-2", "cores": -1})
        assert (bad.status_code, bad.json()["code"]) == (422, "invalid"), bad.text
        assert "cores must be >= 0" in bad.json()["error"]
        # Nothing changed: no record, no event.
        assert gw.get("/jobs/etl-1").status_code == 404
        assert stack.record("etl-1") is None and stack.record("etl-2") is None
        assert bus.stored("HOPS_JOBS", "hops.v1.jobs.events.etl-1") == []
        # A GPU job stating cores is admitted.
        gpu = {**catalog_spec("g1", LONG, requirements=[2]), "cores": 6, "category": "cv"}
        assert gw.post("/jobs", json=gpu).status_code == 201

    until(lambda: stack.phase("g1") == "running", "g1 running", 90, stack.logs)
    until(lambda: "g1" in stack.allocs(), "g1 booked", 30, stack.logs)
    body = nodes_json(stack)
    servers = {s["id"]: s for s in body["servers"]}
    assert {k: (s["cores"], s["cores_used"] + s["cores_free"]) for k, s in servers.items()} == {
        "rtx-0": (16, 16), "rtx-1": (24, 24)}
    held = {k: s["cores_used"] for k, s in servers.items() if s["cores_used"]}
    placed = stack.allocs()["g1"]["configuration"]["parts"]
    assert held == {sid: 2 * gpus for sid, gpus in placed}, (held, placed)
    assert all("g1" in servers[sid]["jobs"] for sid in held)
    totals = body["totals"]
    assert (totals["cores"], totals["cores_used"], totals["cores_free"]) == (
        40, sum(held.values()), 40 - sum(held.values()))
    text = CliRunner().invoke(app, ["nodes", "--gateway", stack.config.gateway_url,
                                    "--token", stack.admin_token]).output
    assert "cores used/free" in text and f"CPU cores {sum(held.values())} used" in text
